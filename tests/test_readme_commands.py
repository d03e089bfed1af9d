"""Every `agl` command the READMEs and the documentation site show parses: each `bash` block's `agl …` lines are given to the command line's
own parser (the real `agl` group, its plugins `train` and `bench` included), so an option that does not exist or
an argument too many fails here, not in a new user's shell (issue #29, friction 5). Values are not checked (a
README writes `tasks.jsonl` for a file the reader has); every `python` block must compile.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import click
import pytest

from agl.cli.main import cli

REPO = Path(__file__).resolve().parents[1]
# the READMEs and the documentation site's pages (docs/, `make docs`)
READMES = sorted(
    [
        REPO / "README.md",
        *REPO.glob("packages/*/README.md"),
        REPO / "benchmarks" / "README.md",
        *REPO.glob("docs/**/*.md"),
    ]
)
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)


def blocks(kind: str) -> list[tuple[str, int, str]]:
    """(readme, line, text) of each fenced block of `kind`."""
    out = []
    for path in READMES:
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == kind:
                out.append((str(path.relative_to(REPO)), text[: match.start()].count("\n") + 1, match.group(2)))
    return out


def agl_lines(block: str) -> list[str]:
    """The `agl …` commands of a bash block: continuation lines joined, comments and env assignments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for raw in joined.splitlines():
        line = raw.split(" #", 1)[0].strip()
        for part in re.split(r"\s(?:&&|\|\||\||;)\s", line):  # each command of a pipeline or list
            words = shlex.split(part.strip().removesuffix("&").strip(), comments=True) if part.strip() else []
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words.pop(0)  # VAR=value before the command
            if words and words[0] == "agl":
                out.append(shlex.join(words[1:]))
    return out


def inline_commands() -> list[tuple[str, str]]:
    """`agl …` written in the text (a code span), as the reader would type it."""
    out = []
    for path in READMES:
        text = FENCE.sub("", path.read_text())
        for match in re.finditer(r"`agl ([^`]+)`", text):
            words = shlex.split(match.group(1))
            # prose may write placeholders (`runs/<a finished run>`) or shorthands (`agl bench eval/train`, `agl
            # bench` alone): checked are the spans that name a whole command, as a reader would type it
            span = match.group(1)
            if not words or words[0].startswith("-") or "/" in " ".join(words[:2]) or "<" in span or "…" in span:
                continue
            if words[0] == "bench" and len(words) < 2:
                continue
            out.append((f"{path.relative_to(REPO)} (text)", shlex.join(words)))
    return out


def parse(args: list[str]) -> None:
    """Parse `agl ARGS` down to the leaf command, as the shell would run it, without running anything."""
    command: click.Command = cli
    ctx = cli.make_context("agl", list(args), resilient_parsing=True)
    words = list(args)
    while isinstance(command, click.Group):
        # skip the group's own options, then descend into the named subcommand
        name = next((w for w in words if not w.startswith("-")), None)
        assert name is not None, f"no subcommand in {args}"
        sub = command.get_command(ctx, name)
        assert sub is not None, f"`agl {' '.join(args)}`: no command {name!r}"
        words = words[words.index(name) + 1 :]
        command, ctx = sub, sub.make_context(name, list(words), parent=ctx, resilient_parsing=True)
    try:
        command.make_context(command.name or "", list(words), parent=ctx.parent)
    except click.exceptions.NoSuchOption as exc:
        raise AssertionError(f"`agl {' '.join(args)}`: {exc.format_message()}") from None
    except click.UsageError as exc:
        if "unexpected extra argument" in exc.format_message():
            raise AssertionError(f"`agl {' '.join(args)}`: {exc.format_message()}") from None
    except click.BadParameter:
        pass  # a value the README leaves to the reader (a file, a URL)
    except click.exceptions.Exit:
        pass  # --help, --version


COMMANDS = [(f"{readme}:{line}", cmd) for readme, line, block in blocks("bash") for cmd in agl_lines(block)]
COMMANDS += inline_commands()


def test_the_readmes_show_agl_commands() -> None:
    assert len(COMMANDS) > 20


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_each_agl_command_in_the_readmes_parses(where: str, command: str) -> None:
    parse(shlex.split(command))


@pytest.mark.parametrize(("readme", "line", "code"), blocks("python"), ids=lambda v: str(v)[:40])
def test_each_python_block_in_the_readmes_compiles(readme: str, line: int, code: str) -> None:
    compile(code, f"{readme}:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)  # snippets await freely


def test_a_wrong_option_or_argument_is_caught() -> None:
    with pytest.raises(AssertionError, match="No such option"):
        parse(["rollouts", "--colour"])
    with pytest.raises(AssertionError, match="unexpected extra argument"):
        parse(["export", "--agents", "writer", "RUN_DIR"])  # what the CrewAI README once said


def test_the_adapters_pins_work_as_constraints() -> None:
    """pip refuses a constraints file with extras ("Constraints cannot have extras"): the pins have none."""
    from packaging.requirements import Requirement

    lines = [line.split("#", 1)[0].strip() for line in (REPO / "requirements-adapters.txt").read_text().splitlines()]
    requirements = [Requirement(line) for line in lines if line]
    assert requirements and all(not r.extras for r in requirements), [str(r) for r in requirements if r.extras]
    assert all(str(r.specifier).startswith("==") for r in requirements)


def shown_task_keys(text: str) -> set[str]:
    """Keys of the example tasks a README shows: inline `{...}` JSON objects (one task input each)."""
    keys: set[str] = set()
    for match in re.finditer(r"`(\{[^`]*\})`", FENCE.sub("", text)):
        try:
            value = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            keys |= set(value)
    return keys


ADAPTER_READMES = sorted(REPO.glob("packages/*-adapter/README.md"))


@pytest.mark.parametrize("readme", ADAPTER_READMES, ids=lambda p: p.parent.name)
def test_every_task_key_a_rollout_snippet_reads_is_in_an_example_task_of_its_readme(readme: Path) -> None:
    text = readme.read_text()
    read = {
        key
        for kind, block in ((m.group(1), m.group(2)) for m in FENCE.finditer(text))
        if kind in ("diff", "python")
        for key in re.findall(r"""task\[["'](\w+)["']\]""", block)
    }
    assert read, f"{readme}: no rollout snippet reads a task key"
    missing = read - shown_task_keys(text)
    assert not missing, (
        f"{readme.relative_to(REPO)}: snippets read task keys {sorted(missing)} that no example task shows"
    )
