"""The README and the docs site as a reader meets them: the site builds in strict mode (a broken
link or a missing reference fails), every Python block runs as printed in a fresh process with
its own cache and working folder, every `freshper ...` command a page or `freshper --help` shows
(in a shell block or inline) parses with the subcommand's own parser and names presets, arms and
options that exist with values they accept, every `section.field` a page names is an option, and
the README reads in five minutes."""
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from freshper.trainer import cli
from freshper.trainer import config as C
from freshper.trainer.flags import config_overrides, parse_overrides
from freshper.trainer.study import chance, compare

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "RESULTS.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
# Each pre-registered study's folder: its registration (REGISTRATION.md, frozen) and its runs' record (README.md).
STUDIES = [ROOT / "results" / f"study-{name}" for name in ("multiply", "frozenlake", "precision-cpu", "staleness",
                                                           "stale-replay")]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
INDENTED = re.compile(r"(?:^|\n\n)((?:    [^\n]*\n?)+)")  # a Markdown code block by indentation


def blocks(langs):
    out = []
    for p in PAGES + [study / "REGISTRATION.md" for study in STUDIES]:  # a registration's command must run
        text = p.read_text(encoding="utf-8")
        out += [(f"{p.relative_to(ROOT)}:{i}", code) for i, (lang, code) in enumerate(FENCE.findall(text))
                if lang in langs]
        if "" in langs:  # the indented blocks too (the registrations write their commands so)
            bare = FENCE.sub("", text)
            out += [(f"{p.relative_to(ROOT)}:indented{i}", "\n".join(line[4:] for line in block.splitlines()))
                    for i, block in enumerate(INDENTED.findall(bare))]
    return out


PYTHON = blocks({"python"})


def tool_help() -> str:
    """What `freshper --help` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["--help"]) == 0
    return out.getvalue()


SUBCOMMANDS = tuple(cli.COMMANDS)
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1"}  # the command ends there


def command_line(line: str):
    """(argv after `freshper`, PYTHONPATH entries) of a shell line that runs a freshper command
    (directly, as python -m freshper.trainer.cli, or under torchrun), or None."""
    words = shlex.split(line)
    words = words[:next((i for i, w in enumerate(words) if w in SHELL_OPERATORS), len(words))]
    paths = []
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value prefixes
        name, _, value = words.pop(0).partition("=")
        if name == "PYTHONPATH":
            paths += [v for v in value.split(":") if v and not v.startswith("$")]
    if words[:1] == ["freshper"] and words[1:2] and re.fullmatch(r"[a-z][a-z-]*", words[1]):
        return words[1:], paths  # a subcommand, or a word in its place that check_command refuses
    if "freshper.trainer.cli" in words:
        rest = words[words.index("freshper.trainer.cli") + 1:]
        return (rest, paths) if rest[:1] and rest[0] in SUBCOMMANDS else None
    if words[:2] in (["python", "-m"], ["python3", "-m"]) and words[2:3] and words[2].startswith("freshper."):
        return ["module", words[2]], paths
    return None


PLACEHOLDER_OPTIONS = ("--section.field",)  # "[--section.field VALUE ...]": any config flag


def shell_lines():
    """(where, text) of every line a reader may paste: the lines of shell blocks (continuations
    joined), each inline code span of a page, and the example lines of `freshper --help`."""
    out = [(where, line) for where, code in blocks({"bash", "sh", ""})
           for line in code.replace("\\\n", " ").splitlines()]
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        out += [(f"{page.relative_to(ROOT)}:inline", " ".join(span.split())) for span in re.findall(r"`([^`]+)`", text)]
    for line in tool_help().splitlines():
        if line.startswith("    freshper "):  # the explanation after three spaces and a bracket is not typed
            out.append(("freshper --help", re.split(r"\s{3,}\(", line.strip())[0]))
    return out


def command_lines():
    """(where, argv, PYTHONPATH, options in its [optional] parts) of each freshper command line
    (comments and [optional] parts dropped, their option names kept; lines with '...'
    placeholders, a --resume or a $VARIABLE skipped). An inline span without values names a
    subcommand or its options: its option names are checked, not its missing arguments."""
    out = []
    for where, line in shell_lines():
        line = line.split("  #")[0].split(" # ")[0]
        optional = [w.split("=")[0] for part in re.findall(r"\[([^\]]*)\]", line) for w in part.split()
                    if w.startswith("--") and w not in PLACEHOLDER_OPTIONS]
        line = re.sub(r"\[[^\]]*\]", " ", line).strip()
        if not line or "..." in line or "--resume" in line or "$" in line.replace("$PWD", ""):
            continue
        try:
            found = command_line(line)
        except ValueError:  # unbalanced quotes: not a shell line
            continue
        if found:
            argv, paths = found
            if where.endswith(":inline") and all(w.startswith("--") for w in argv[1:]):
                # no value: prose naming a subcommand or its options ("`freshper compare --arms`"),
                # checked as names, with --help for the parse (not as a command missing its arguments)
                argv, optional = [argv[0], "--help"], optional + argv[1:]
            out.append((where, argv, paths, optional))
    return out


COMMANDS = command_lines()


def test_the_pages_have_code():
    assert len(PYTHON) >= 5 and len(COMMANDS) >= 20


def test_the_site_builds_in_strict_mode(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--rollout.lag" in (tmp_path / "site" / "configuration" / "index.html").read_text(), \
        "the option reference is generated from the config"


@pytest.mark.parametrize("where,code", PYTHON, ids=[w for w, _ in PYTHON])
def test_python_block_runs(where, code, tmp_path):
    env = {**os.environ, "FRESHPER_CACHE": str(tmp_path / "cache"), "TRITON_INTERPRET": "0",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, f"{where}:\n{code}\n--- stderr:\n{out.stderr[-3000:]}"


def parser_of(cmd: str, args: list[str]):
    """The subcommand's own parser, as `freshper CMD ARGS` builds it."""
    return {"train": lambda: cli.train_parser(args), "profile": lambda: cli.profile_parser(args),
            "eval": cli.eval_parser, "export": cli.export_parser, "plot": cli.plot_parser, "chance": chance.parser,
            "compare": compare.parser}[cmd]()


PASS_THROUGH = ("compare", "chance")  # their parsers leave the config flags to flags.parse_overrides
# Spellings a subcommand still accepts so that old scripts run, which a page or the help must not teach.
OLD_SPELLINGS = {("compare", "--env"): "--preset"}


def check_command(argv: list[str], optional: list[str] = ()) -> None:
    """What the command line would be refused for, before it ran: ValueError naming it. compare's
    line goes through compare's own parser and checks (the ones a run meets), the others through
    the subcommand's own parser and the config; a `python -m` module must exist. `optional`: the
    option names of the line's [optional] parts, each an option of the subcommand."""
    import importlib.util

    cmd, args = argv[0], argv[1:]
    if cmd not in SUBCOMMANDS + ("module",):
        raise ValueError(f"freshper has no subcommand {cmd!r}; subcommands: {', '.join(SUBCOMMANDS)}")
    if cmd == "module":
        if importlib.util.find_spec(args[0]) is None:
            raise ValueError(f"python -m {args[0]}: no such module")
        return
    for name in [a.split("=")[0] for a in args if a.startswith("--")] + list(optional):
        if (cmd, name) in OLD_SPELLINGS:
            raise ValueError(f"freshper {cmd} {name} is the old spelling of {OLD_SPELLINGS[cmd, name]}")
    p = parser_of(cmd, args)
    for name in optional:
        if name not in p._option_string_actions:
            if cmd not in PASS_THROUGH:
                raise ValueError(f"freshper {cmd} has no option {name}")
            C.resolve_key(name[2:])  # raises: not a config flag either
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if cmd == "compare":
                compare.parse(args)
                return
            ns, rest = p.parse_known_args(args)
    except SystemExit as e:
        if e.code == 0:  # --help: printed, nothing run
            return
        raise ValueError(err.getvalue().strip().splitlines()[-1]) from None
    if cmd in ("export", "plot"):
        if rest:
            raise ValueError(f"freshper {cmd}: unrecognized arguments {rest}")
        return
    over = parse_overrides(rest) if cmd in PASS_THROUGH else config_overrides(ns, rest)
    C.load(getattr(ns, "preset", None) or cli.DEFAULT_PRESET, None, over)


PATHS = ("--env.data", "--env.eval_data", "--env.corpus")  # the user's files: stand-ins are made for them


@pytest.mark.parametrize("where,argv,paths,optional", COMMANDS,
                         ids=[f"{w}:{' '.join(a)[:60]}" for w, a, _, _ in COMMANDS])
def test_command_line_is_accepted(where, argv, paths, optional, tmp_path, monkeypatch):
    for p in paths:  # PYTHONPATH=examples: a user's task module, as the line runs it from the checkout
        monkeypatch.syspath_prepend(str(ROOT / p))
    monkeypatch.chdir(tmp_path)
    for key, value in zip(argv, argv[1:]):
        if key in PATHS and not value.startswith("hub:"):
            Path(value).parent.mkdir(parents=True, exist_ok=True)
            Path(value).touch()
    check_command(argv, optional)


@pytest.mark.parametrize("argv, optional", [
    (["train", "--algo.taus", "3"], []), (["train", "--preset", "qwen9"], []),
    (["compare", "--arms", "on-policy,fresh"], []), (["train", "--rollout.lag", "65"], []),
    (["compare", "--env", "frozenlake"], []), (["export", "RUN", "OUT", "--iterations", "3"], []),
    (["chance", "--episodes", "many"], []), (["eval", "RUN", "--sample", "4"], []), (["plot"], []),
    (["profile", "--iterations", "1:2", "--train.nam", "x"], []), (["eval", "RUN"], ["--eval.episode"]),
    (["compare"], ["--budgets"]), (["chance"], ["--env.sizes"]), (["evaluate", "RUN"], [])])
def test_a_wrong_command_line_is_caught(argv, optional):
    with pytest.raises(ValueError):
        check_command(argv, optional)


def test_the_help_names_every_subcommand_and_shows_each():
    """`freshper --help`'s summary line lists every subcommand, each has an example line, and its
    comparison has the update-matched control (a replay arm's gain at equal updates)."""
    text = tool_help()
    summary = next(line for line in text.splitlines() if line.startswith("`freshper` command line:"))
    assert sorted(w.strip(" .") for w in summary.split(":", 1)[1].split(",")) == sorted(cli.COMMANDS)
    examples = [line.split() for line in text.splitlines() if line.startswith("    freshper ")]
    assert {words[1] for words in examples} == set(cli.COMMANDS)
    compare_line = next(words for words in examples if words[1] == "compare")
    assert "on-policy-matched" in compare_line[compare_line.index("--arms") + 1].split(",")


README_WORDS = 1200  # five minutes at about 240 words a minute


def test_the_readme_reads_in_five_minutes():
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words <= README_WORDS, f"README.md has {words} words"


# The user-facing pages and the options' own help (--help and docs/configuration.md): every
# `section.field` they name is an option. Not options: file names (train.log, rollout.py), a glob
# (algo.clip_*: checked as a prefix) and the environment's own method in docs/design.md's diagram.
OPTION_PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
SECTION_FIELD = re.compile(r"(?<![\w./])(" + "|".join(C.Config.__dataclass_fields__) + r")\.([A-Za-z_]\w*)(\*?)")
FILE_SUFFIXES = {"py", "log", "parquet", "jsonl", "json", "yaml", "md", "png", "csv", "txt"}
NOT_OPTIONS = {"env.step"}


def unknown_options(text: str) -> list[str]:
    """The `section.field` names in `text` that are no option."""
    table = C.field_table()
    out = []
    for m in SECTION_FIELD.finditer(text):
        name, glob = f"{m.group(1)}.{m.group(2)}", m.group(3)
        if m.group(2) in FILE_SUFFIXES or name in NOT_OPTIONS:
            continue
        if not (any(k.startswith(name) for k in table) if glob else name in table):
            out.append(name + glob)
    return out


@pytest.mark.parametrize("where", [*[str(p.relative_to(ROOT)) for p in OPTION_PAGES], "option help"])
def test_every_option_a_page_names_exists(where):
    text = ("\n".join(h for _, _, h in C.field_table().values()) if where == "option help"
            else (ROOT / where).read_text(encoding="utf-8"))
    assert unknown_options(text) == []


def test_a_named_option_that_does_not_exist_is_found():
    assert unknown_options("`rollout.async`, algo.clip_* and --train.iteration 3") == ["rollout.async",
                                                                                        "train.iteration"]
    assert unknown_options("RUN_DIR/train.log, env.step, eval.samples, algo.clip_*, trainer/train/loop.py") == []


def test_the_preset_table_names_every_preset():
    """docs/configuration.md's preset table is where a reader looks them up: it lists each one."""
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    table = text[text.index("## Presets"):text.index("## Every option")]
    assert [p for p in C.PRESETS if f"`{p}`" not in table] == []


LINKED = [ROOT / "README.md", ROOT / "RESULTS.md", ROOT / "BENCHMARKS.md", ROOT / "results" / "HISTORY.md",
          ROOT / "results" / "benchmarks" / "HISTORY.md", *[study / "README.md" for study in STUDIES],
          *sorted((ROOT / "docs").glob("*.md"))]
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_in_the_repository(page):
    """Where most readers read, on GitHub: a relative link names a file of the checkout (the site
    build rewrites the ones to RESULTS.md and BENCHMARKS.md to its own copies, docs/hooks.py)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = [t for t in MD_LINK.findall(text)
              if not re.match(r"[a-z]+:|#", t) and not (page.parent / t.split("#")[0]).exists()]
    assert broken == []


# Words about how the project was made, not about what it is: a reader needs the fact ("never
# run on a GPU"), not its history. The registrations (results/study-*/REGISTRATION.md) are frozen
# and keep their words.
PROCESS = re.compile(r"\B#\d{2,}\b|\bthe issue\b|\bissue's\b|\bissues\b|\btoday\b|\bthis round\b|\bround's\b"
                     r"|\bsessions?\b|has been lent|been available to this project", re.I)
REGISTRATION = re.compile(r"## Pre-registered study: FreshPER against what users would do instead.*?"
                          r"starts over in a later session\.", re.S)


# Each study's registration as committed before its runs (bd7f183, 19057d7, and the precision
# and staleness studies' registering commits), by its SHA-256, with the file that holds it (moved
# there from RESULTS.md byte for byte): a registration may not change once a run has started, so
# an edit to any fails here, and so does anything added to its file.
REGISTRATIONS = {
    "ce1155395655a3c11a0db26a0350e807bbe68f4601f9a74bcee42ac548e4c004": ("multiply", REGISTRATION),
    "09f530c6d3acd687592e26b311b508467d4a0de2c8ccd0a45347230a54323ad8": ("frozenlake", re.compile(
        r"## Pre-registered study: FreshPER on FrozenLake\n.*?no readout is taken before\.", re.S)),
    "48c772b633ce8ea1d8e1575d307e44e8263c4b7d3630014e9176fcfffa09d0b8": ("precision-cpu", re.compile(
        r"## Pre-registered study: bf16 against float32 on the CPU\n.*?\(End of the registration\. What follows is "
        r"added as the runs come in\.\)", re.S)),
    "dfda9d01a158aedfb16dd962669235af6b0e61a121a68b4612ca189f668cb843": ("staleness", re.compile(
        r"## Pre-registered study: keep stale rollouts or drop them\n.*?\(End of the registration\. What follows "
        r"is added as the runs come in\.\)", re.S)),
    "13cdd7c4be56332d5b5bfc7a830a33ec079458c65c6cfcfa376317bb055d3ce4": ("stale-replay", re.compile(
        r"## Pre-registered study: replay over stale data\n.*?\(End of the registration\. What follows is added "
        r"as the runs come in\.\)", re.S)),
}


@pytest.mark.parametrize("digest", sorted(REGISTRATIONS))
def test_the_registrations_are_as_committed_before_their_runs(digest):
    import hashlib

    name, pattern = REGISTRATIONS[digest]
    text = (ROOT / "results" / f"study-{name}" / "REGISTRATION.md").read_text(encoding="utf-8")
    found = pattern.search(text)
    assert found is not None
    assert hashlib.sha256(found.group(0).encode()).hexdigest() == digest
    assert text == found.group(0) + "\n", "the file holds the registration and nothing else"


@pytest.mark.parametrize("page", [p for p in PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_say_what_is_not_how_it_was_made(page):
    text = page.read_text(encoding="utf-8")
    found = sorted({m.group(0) for m in PROCESS.finditer(text)})
    assert found == []


def test_the_readmes_figures_are_the_current_tables():
    """Each figure of the README's status table (x-ratios, signed differences, times) is stated in
    BENCHMARKS.md's or RESULTS.md's current part, so the two cannot drift apart unseen."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    status = readme[readme.index("## Status"):readme.index("## Set-up")]
    figures = set(re.findall(r"\d+\.\d+x|[−+]\d\.\d{3}|\[[−+]\d\.\d{3}, [−+]\d\.\d{3}\]|\d+\.\d+(?:–\d+\.\d+)? ms"
                             r"|\d+\.\d+ s → \d+\.\d+ s", status))
    bench = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    results = (ROOT / "RESULTS.md").read_text(encoding="utf-8")
    table = bench.index("## Current figures")
    current = bench[table:bench.index("\n## ", table + 5)] + results[:results.index("## Pre-registered study")]
    assert len(figures) >= 6, figures
    assert sorted(f for f in figures if f not in current) == []


@pytest.mark.parametrize("needle", ["rewards:exact_boxed", "word_reverse:WordReverse"])
def test_the_own_task_examples_run_as_the_page_gives_them(needle, tmp_path):
    """docs/own-task.md's two commands, from the checkout's root, word for word but one iteration
    long and writing under a temporary folder."""
    page = (ROOT / "docs" / "own-task.md").read_text(encoding="utf-8")
    line = next(x for _, code in FENCE.findall(page) for x in code.splitlines() if needle in x)
    words = shlex.split(line)
    env = {**os.environ, "FRESHPER_CACHE": str(tmp_path / "cache")}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[:2] == ["freshper", "train"], line
    argv = [sys.executable, "-m", "freshper.trainer.cli", *words[1:], "--train.iterations", "1", "--eval.every", "0",
            "--train.run_dir", str(tmp_path / "runs"), "--train.progress", "false"]
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert list((tmp_path / "runs").glob("*/metrics.jsonl"))


def test_every_commit_a_figure_names_is_dated_in_the_commits_page():
    """A quoted commit is placed in time by docs/commits.md (its date and subject)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = (ROOT / "docs" / "commits.md").read_text(encoding="utf-8")
    quoted, hash7 = set(), re.compile(r"(?<![0-9a-zA-Z_/.-])([0-9a-f]{7})(?![0-9a-zA-Z_-])")
    for page in LINKED:
        if page.name != "commits.md":
            quoted |= set(hash7.findall(page.read_text(encoding="utf-8")))
    commits = {h for h in quoted if subprocess.run(["git", "cat-file", "-t", h], cwd=ROOT, capture_output=True,
                                                     text=True).stdout.strip() == "commit"}
    assert len(commits) >= 10
    assert sorted(h for h in commits if f"`{h}`" not in listed) == []
