"""Imports run one way: no cycle among the project's modules, counting imports inside functions
too (a lazy import is still a dependency), and freshper/ never imports the trainer."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"freshper": "freshper", "kernels": "freshper.kernels", "trainer": "freshper.trainer",
            "profiling": "freshper.profiling"}


def modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in PACKAGES.items():
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges = {m: set() for m in mods}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    stem = base[:len(base) - node.level + 1] + (node.module.split(".") if node.module else [])
                else:
                    stem = (node.module or "").split(".")
                prefix = ".".join(stem)
                targets = [f"{prefix}.{a.name}" for a in node.names] + [prefix]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):  # a package's own __init__ is not a cycle
                    edges[name].add(t)
    return edges


def find_cycle(edges):
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                c = visit(m)
                if c:
                    return c
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(edges):
        if n not in state:
            c = visit(n)
            if c:
                return c
    return None


def test_no_import_cycles():
    assert find_cycle(graph()) is None, find_cycle(graph())


def test_the_library_never_imports_the_trainer():
    edges = graph()
    bad = {m: sorted(t for t in ts if t.startswith("freshper.trainer")) for m, ts in edges.items()
           if not m.startswith(("freshper.trainer", "freshper.profiling"))}
    assert not any(bad.values()), bad


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


# trainer/'s folders, lowest first: each imports only those before it; the top-level modules
# every layer shares (config, presets, flags, dist) are left out; cli and entry sit above all
LAYERS = ("envs", "model", "engines", "train", "study")
TOP = ("cli", "entry")


def trainer_layer(module: str):
    parts = module.split(".")
    if parts[:2] != ["freshper", "trainer"] or len(parts) < 3:
        return None
    if parts[2] in LAYERS:
        return LAYERS.index(parts[2])
    return len(LAYERS) if parts[2] in TOP else None


def layering_violations(edges) -> list[str]:
    bad = []
    for m, ts in edges.items():
        lm = trainer_layer(m)
        if lm is None:
            continue
        for t in ts:
            lt = trainer_layer(t)
            if lt is not None and lt > lm:
                bad.append(f"{m} -> {t}")
    return sorted(bad)


def test_trainer_folders_import_one_way():
    assert layering_violations(graph()) == []


def test_the_layering_check_sees_an_upward_import():
    edges = graph()
    edges["freshper.trainer.model.policy"] = edges["freshper.trainer.model.policy"] | {"freshper.trainer.train.loop"}
    edges["freshper.trainer.study.chance"] = edges["freshper.trainer.study.chance"] | {"freshper.trainer.cli"}
    assert layering_violations(edges) == ["freshper.trainer.model.policy -> freshper.trainer.train.loop",
                                          "freshper.trainer.study.chance -> freshper.trainer.cli"]


def config_climbs(edges) -> list[str]:
    """Imports from trainer/config into the folders above the environments (model, engines,
    train, study, cli, entry): config checks a run before any of them is built."""
    above = tuple(f"freshper.trainer.{f}" for f in (*LAYERS[1:], *TOP))
    return sorted(f"{m} -> {t}" for m, ts in edges.items() if m.startswith("freshper.trainer.config")
                  for t in ts if t.startswith(above))


def test_config_reads_nothing_above_the_environments():
    assert config_climbs(graph()) == []


def test_the_config_check_sees_a_climb():
    edges = graph()
    edges["freshper.trainer.config.checks"] = edges["freshper.trainer.config.checks"] | {
        "freshper.trainer.model.random_init"}
    assert config_climbs(edges) == ["freshper.trainer.config.checks -> freshper.trainer.model.random_init"]
