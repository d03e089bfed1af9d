"""MkDocs hook: the reference pages' generated parts, from the code itself at every build, never hand-copied.

A page holds a marker comment where a part goes:

- `<!-- agl:cli -->`: every `agl` command (built-in and those other agl packages register), its usage, help and
  every option, walked through click as `agl --help` would;
- `<!-- agl:rest -->`: every route of `agl serve`'s OpenAPI document, by tag;
- `<!-- agl:options -->`: every key an option file (`agl train --config`) takes, with its flag, default and help;
- `<!-- agl:layout -->`: agl-core's stages and folders, and what each stage imports, from the import graph of its
  source (`agl.common.layout`, the same map `packages/core/tests/test_layout.py` checks);
- `<!-- agl:trainer-layout -->`: the same picture of agl-trainer (`agl_trainer.stages`, which
  `packages/trainer/tests/test_trainer_layout.py` checks);
- `<!-- agl:gpu-plans -->`: the GPU guide's table of plans, made by `agl train --plan`'s own code
  (`agl_trainer.plan.table`) from the published model configs the tests plan with.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import click

MARKERS = ("cli", "rest", "options", "gpu-plans", "layout", "trainer-layout")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name in MARKERS:
        marker = f"<!-- agl:{name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, GENERATORS[name]())
    return markdown


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# ------------------------------------------------------------------------------------------------------ CLI


def walk_commands(group: click.Group, prefix: str = "agl") -> list[tuple[str, click.Command]]:
    """(`agl sub sub`, command) for every command under `group`, depth first, in `--help` order."""
    ctx = click.Context(group, info_name=prefix)
    out: list[tuple[str, click.Command]] = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        path = f"{prefix} {name}"
        out.append((path, command))
        if isinstance(command, click.Group):
            out += walk_commands(command, path)
    return out


def _option_row(param: click.Parameter) -> str:
    assert isinstance(param, click.Option)
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    if param.is_flag:
        kind = "flag"
    elif isinstance(param.type, click.Choice):
        kind = " \\| ".join(f"`{c}`" for c in param.type.choices)
    else:
        kind = param.type.name
    default = param.default
    unset = type(default).__name__ == "Sentinel"  # click's "no default given"
    shown = "" if unset or default in (None, (), False) or callable(default) else f"`{default}`"
    return f"| {names} | {kind} | {shown} | {_cell(param.help or '')} |"


def cli_reference() -> str:
    from agl.cli.main import cli

    parts = []
    for path, command in walk_commands(cli):
        ctx = click.Context(command, info_name=path)
        usage = " ".join(command.collect_usage_pieces(ctx))
        parts.append(f"### `{path}`\n\n```text\n{path} {usage}\n```\n\n{_dedent(command.help or '')}\n")
        options = [
            p
            for p in command.get_params(ctx)
            if isinstance(p, click.Option) and not p.hidden and p is not command.get_help_option(ctx)
        ]
        if options:
            rows = "\n".join(_option_row(p) for p in options)
            parts.append(f"| option | type | default | what |\n| --- | --- | --- | --- |\n{rows}\n")
    return "\n".join(parts)


def _dedent(text: str) -> str:
    import inspect

    return inspect.cleandoc(text).replace("\b\n", "")


# ----------------------------------------------------------------------------------------------------- REST


def openapi_document() -> dict[str, Any]:
    """`agl serve`'s OpenAPI document, from a server on a throw-away store."""
    from agl.server.app import Server, ServerSettings

    with tempfile.TemporaryDirectory(prefix="agl-docs-") as tmp:
        server = Server(ServerSettings(run_dir=Path(tmp)))
        try:
            with warnings.catch_warnings():  # FastAPI names GET and HEAD /healthz alike; both are documented
                warnings.simplefilter("ignore", UserWarning)
                return dict(server.app.openapi())
        finally:
            server.store.close()


def rest_reference() -> str:
    by_tag: dict[str, list[str]] = {}
    for route, methods in openapi_document()["paths"].items():
        for method, op in methods.items():
            tag = (op.get("tags") or ["other"])[0]
            params = ", ".join(
                f"`{p['name']}` ({p['in']}{', required' if p.get('required') else ''})"
                for p in op.get("parameters", [])
            )
            body = op.get("requestBody", {}).get("content", {})
            schema = next(iter(body.values()), {}).get("schema", {}) if body else {}
            body_name = schema.get("$ref", "").rsplit("/", 1)[-1] or schema.get("type", "")
            codes = ", ".join(sorted(op.get("responses", {})))
            text = _cell(op.get("description") or op.get("summary") or "")
            entry = f"| `{method.upper()} {route}` | {text} | {params} | {f'`{body_name}`' if body_name else ''} | {codes} |"
            by_tag.setdefault(tag, []).append(entry)
    head = "| route | what | parameters | body | answers |\n| --- | --- | --- | --- | --- |"
    return "\n".join(f"### {tag}\n\n{head}\n" + "\n".join(rows) + "\n" for tag, rows in sorted(by_tag.items()))


# -------------------------------------------------------------------------------------------------- options


def options_reference() -> str:
    from agl_trainer.options import FILE_ONLY_KEYS, SPECS, _dataclass_defaults, known_keys

    defaults = _dataclass_defaults()
    rows = []
    for key in sorted(known_keys()):
        spec = SPECS.get(key)
        flag = f"`{spec.option}`" if spec else "(option file only)"
        default = defaults.get(key)
        shown = "" if default in (None, (), []) else f"`{default}`"
        rows.append(f"| `{key}` | {flag} | {shown} | {_cell(spec.help if spec else FILE_ONLY_KEYS[key])} |")
    return "| key | flag | default | what |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"


def layout() -> str:
    """A picture of agl-core's stages, highest first (each box: its folders and modules, and the stages below it
    that its modules import, read from the code), then a table of the folders."""
    import agl
    from agl.common.layout import STAGES, graph, stage

    root = Path(agl.__file__).parent
    return _stages_picture(graph(root), STAGES, stage, root)


def trainer_layout() -> str:
    """The same picture of agl-trainer's stages, from its own map."""
    from agl_trainer.stages import ROOT, STAGES, graph, stage

    return _stages_picture(graph(), STAGES, stage, ROOT)


def _stages_picture(
    modules: dict[str, set[str]], stages: list[tuple[str, str, tuple[str, ...]]], stage: Any, root: Path
) -> str:
    package = root.name
    members: dict[int, list[str]] = {rank: [] for rank in range(len(stages))}
    uses: dict[int, set[int]] = {rank: set() for rank in range(len(stages))}
    for name, targets in modules.items():
        rank = stage(name)
        members[rank].append(name)
        uses[rank] |= {stage(t) for t in targets if t != package and stage(t) < rank}
    width = 108
    lines = ["```"]
    for rank in reversed(range(len(stages))):
        title, what, _ = stages[rank]
        below = ", ".join(stages[r][0] for r in sorted(uses[rank], reverse=True)) or f"nothing of {package}"
        folders = sorted({".".join(m.split(".")[:2]) for m in members[rank]})
        lines.append("┌" + "─" * (width - 2) + "┐")
        for text in (f"{title}: {what}", f"  {', '.join(folders)}", f"  imports: {below}"):
            while text:
                lines.append("│ " + text[: width - 4].ljust(width - 4) + " │")
                text = ("    " + text[width - 4 :]) if len(text) > width - 4 else ""
        lines.append("└" + "─" * (width - 2) + "┘")
        if rank:
            lines.append(" " * (width // 2 - 1) + "▼")
    lines.append("```")
    rows = ["", "| folder | stage | modules |", "| --- | --- | --- |"]
    packages: dict[str, list[str]] = {}
    for name in sorted(modules):
        parts = name.split(".")
        folder = ".".join(parts[:2]) if len(parts) > 2 or (root / parts[-1]).is_dir() else name
        if name == package:
            folder = package
        packages.setdefault(folder, []).append(name)
    for folder, names in sorted(packages.items(), key=lambda kv: (stage(kv[0]), kv[0])):
        short = ", ".join(f"`{n.removeprefix(folder + '.') or n}`" for n in names if n != folder) or "—"
        rows.append(f"| `{folder}` | {stages[stage(folder)][0]} | {short} |")
    return "\n".join(lines + rows) + "\n"


def gpu_plans() -> str:
    from agl_trainer.plan.table import plan_table

    return plan_table(Path(__file__).parents[2] / "packages" / "trainer" / "tests" / "data" / "models")


GENERATORS = {
    "cli": cli_reference,
    "rest": rest_reference,
    "options": options_reference,
    "gpu-plans": gpu_plans,
    "layout": layout,
    "trainer-layout": trainer_layout,
}
