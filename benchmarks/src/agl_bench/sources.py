"""Where each task's data officially comes from: what `agl bench data fetch TASK` downloads.

Calc-X and MuSiQue come from the Hugging Face datasets hub, as the files the hub holds (parquet shards, the
official JSON Lines), read by the loaders as they are. Spider's databases exist only in the authors' release
archive (`spider_data.zip`, linked from https://yale-lily.github.io/spider); the archive also holds the
official `dev.json`, so Spider needs nothing from the hub (the hub's `xlangai/spider` has the questions only).
QuixBugs is its GitHub repository at a pinned commit, as GitHub's zip archive of that commit (the Python half:
programs, fixed programs, tests, JSON cases, licence).
"""

from __future__ import annotations

from dataclasses import dataclass

QUIXBUGS_COMMIT = "4257f44b0ff1181dedaedee6a447e133219fcebf"


@dataclass(frozen=True)
class HubSource:
    """Files of one dataset repository on the Hugging Face hub."""

    repo_id: str
    patterns: tuple[str, ...]  # which files of the repository (glob patterns on their paths)
    revision: str = "main"

    def describe(self) -> str:
        return f"hf://datasets/{self.repo_id} ({', '.join(self.patterns)})"


@dataclass(frozen=True)
class ArchiveSource:
    """A zip archive on the web; `top` is its one top-level folder, whose content becomes the task folder."""

    url: str
    top: str
    keep: tuple[str, ...]  # what to unpack (glob patterns on paths below `top`); the rest is not needed
    page: str  # where a person downloads it by hand when the URL refuses a script

    def describe(self) -> str:
        return self.url


@dataclass(frozen=True)
class Source:
    task: str
    origin: HubSource | ArchiveSource
    license: str
    cite: str


SOURCES: dict[str, Source] = {
    "calc_x": Source(
        task="calc_x",
        # The Calc-X collection (all its parts, deduplicated, with the authors' train/validation/test split)
        origin=HubSource("MU-NLPC/Calc-X", ("data/*.parquet", "README.md")),
        license="MIT / Apache-2.0 per part (see the dataset card)",
        cite="Kadlčík et al., Calc-X and Calcformers, EMNLP 2023",
    ),
    "musique": Source(
        task="musique",
        # The official MuSiQue-Ans v1.0 files, as released (the authors host them on Google Drive only)
        origin=HubSource("dgslibisey/MuSiQue", ("musique_ans_v1.0_dev.jsonl", "musique_ans_v1.0_train.jsonl")),
        license="CC BY 4.0",
        cite="Trivedi et al., MuSiQue: Multihop Questions via Single-hop Question Composition, TACL 2022",
    ),
    "spider": Source(
        task="spider",
        origin=ArchiveSource(
            # The authors' spider_data.zip (Google Drive file 1403EGqzIDoHMdQF4c9Bkyl7dZLZ5Wt6J, ~200 MB);
            # `confirm=t` skips the page Drive shows before files too large to virus-scan.
            url="https://drive.usercontent.google.com/download?id=1403EGqzIDoHMdQF4c9Bkyl7dZLZ5Wt6J&export=download&confirm=t",
            top="spider_data",
            keep=("dev.json", "dev_gold.sql", "tables.json", "database/*"),
            page="https://yale-lily.github.io/spider",
        ),
        license="CC BY-SA 4.0",
        cite="Yu et al., Spider, EMNLP 2018",
    ),
    "quixbugs": Source(
        task="quixbugs",
        origin=ArchiveSource(
            # Pinned, so every fetch holds the same programs and tests (the repository has had no Python change
            # since); GitHub names the archive's one folder <repository>-<commit>.
            url=f"https://github.com/jkoppel/QuixBugs/archive/{QUIXBUGS_COMMIT}.zip",
            top=f"QuixBugs-{QUIXBUGS_COMMIT}",
            keep=(
                "python_programs/*",
                "correct_python_programs/*",
                "python_testcases/*",
                "json_testcases/*",
                "conftest.py",
                "LICENSE",
                "legal_notes.txt",
            ),
            page="https://github.com/jkoppel/QuixBugs",
        ),
        license="MIT",
        cite="Lin, Koppel, Chen, Solar-Lezama, QuixBugs: A Multi-Lingual Program Repair Benchmark Set Based on the "
        "Quixey Challenge, SPLASH Companion 2017",
    ),
}


# SWE-bench Lite and Verified. How sure the file layout is: the `swebench` package (5.0.2) does not name the hub's
# files — its `harness/utils.py:load_swebench_dataset` calls `datasets.load_dataset(name, split=split)`, which
# resolves any layout, and reads a local folder as `<split>.parquet` — so the layout below is the hub's usual one for a
# dataset pushed with `push_to_hub` (`data/test-00000-of-00001.parquet`, `data/dev-...` for Lite), remembered, not
# seen from here (the hub cannot be reached). `*.parquet` matches files in any folder (fnmatch's `*` crosses `/`),
# and the loader reads either layout, so a different shard name still fetches. The package now says
# `SWE-bench/SWE-bench_Lite` (the datasets moved to the SWE-bench organisation; the hub redirects the old names).
SWEBENCH_SOURCES: dict[str, Source] = {
    "swebench": Source(
        task="swebench",
        origin=HubSource("princeton-nlp/SWE-bench_Lite", ("*.parquet", "README.md")),
        license="MIT (the instances; each repository keeps its own licence)",
        cite="Jimenez et al., SWE-bench: Can Language Models Resolve Real-World GitHub Issues?, ICLR 2024",
    ),
    "swebench_verified": Source(
        task="swebench_verified",
        origin=HubSource("princeton-nlp/SWE-bench_Verified", ("*.parquet", "README.md")),
        license="MIT (the instances; each repository keeps its own licence)",
        cite="Jimenez et al., ICLR 2024; OpenAI, Introducing SWE-bench Verified, 2024",
    ),
}
SOURCES.update(SWEBENCH_SOURCES)


def get_source(task: str) -> Source:
    source = SOURCES.get(task.replace("-", "_"))
    if source is None:
        raise ValueError(f"no official source known for {task!r}; choose one of {', '.join(sorted(SOURCES))}")
    return source
