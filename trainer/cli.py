"""`freshper` command line: train, plot, profile, compare, chance, export, eval.

    freshper train [--preset NAME] [--config FILE.yaml] [--resume RUN_DIR] [--section.field VALUE ...]
    freshper plot RUN_DIR
    freshper profile [train arguments] --iterations S:E
    freshper compare --preset frozenlake --arms on-policy-matched,per,freshper [--budget ENV_STEPS]
    freshper chance --preset frozenlake [--episodes 1000]    (the random-reply policy's score)
    freshper export RUN_DIR [--iteration N] OUT              (a checkpoint as a Hugging Face folder)
    freshper eval RUN_DIR|MODEL_DIR [--preset P] [--eval.episodes N] [--samples k]   (the validation rollout alone)
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import textwrap
from pathlib import Path

from . import config as C
from .flags import WIDTH, Formatter, add_config_flags, config_overrides, presets_epilog


class logging_to:
    """Log INFO to stderr and RUN_DIR/train.log for the duration of a command. Ranks other
    than 0 of a torchrun job (`rank` > 0) log only warnings, to stderr, marked with their rank."""

    def __init__(self, run_dir: Path | None = None, rank: int = 0):
        self.run_dir = run_dir if rank == 0 else None
        self.rank = rank

    def __enter__(self):
        tag = f"[rank {self.rank}] " if self.rank else ""
        fmt = logging.Formatter(f"%(asctime)s {tag}%(levelname)s %(message)s")
        self.handlers = [logging.StreamHandler(sys.stderr)]
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.handlers.append(logging.FileHandler(self.run_dir / "train.log"))
        root = logging.getLogger()
        self.level = root.level
        root.setLevel(logging.INFO if self.rank == 0 else logging.WARNING)
        for h in self.handlers:
            h.setFormatter(fmt)
            root.addHandler(h)
        for noisy in ("transformers", "httpx", "huggingface_hub", "matplotlib"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        try:  # their loading/writing bars would interleave with the run's own progress
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass
        return self

    def __exit__(self, *exc):
        root = logging.getLogger()
        for h in self.handlers:
            root.removeHandler(h)
            h.close()
        root.setLevel(self.level)
        return False


def run_dir_for(cfg: C.Config, preset: str) -> Path:
    """RUN_DIR/<train.name>, or RUN_DIR/<preset>-<mode>-s<seed>: two presets on one env never share a folder."""
    name = cfg.train.name or f"{preset}-{cfg.algo.mode}-s{cfg.train.seed}"
    return Path(cfg.train.run_dir) / name


def holds_run(run_dir: Path) -> bool:
    """Whether `run_dir` already holds (part of) a training run."""
    return any((run_dir / n).exists() for n in ("metrics.jsonl", "checkpoints", "config.yaml"))


class RunLock:
    """An exclusive lock on a run folder for as long as a trainer writes it (`RUN_DIR/.lock`,
    flock: the kernel releases it when the process ends, however it ends). A second trainer on
    the same folder, started by any launcher, stops at once with a message naming the holder."""

    def __init__(self, run_dir: Path):
        import fcntl
        import os

        run_dir.mkdir(parents=True, exist_ok=True)
        self.fh = open(run_dir / ".lock", "a+")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.seek(0)
            holder = self.fh.read().strip() or "?"
            self.fh.close()
            raise ValueError(f"run folder {run_dir} is being written by another trainer (pid {holder}); "
                             f"wait for it, or name another run with --train.name") from None
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"{os.getpid()}\n")
        self.fh.flush()

    def release(self) -> None:
        self.fh.close()


def build_config(args, rest, check_folder: bool = True) -> tuple[C.Config, Path, bool]:
    """(config, run dir, resume?) from what train/profile's parse_known_args returned; every check
    that can fail is made here, before anything is built or written (the occupied-folder check
    only if `check_folder`: under torchrun rank 0 makes it, holding the folder's lock)."""
    overrides = config_overrides(args, rest)
    if args.resume:
        run_dir = Path(args.resume)
        if args.preset is not None or args.config is not None:
            raise ValueError(f"--resume {run_dir} continues the run with its own config.yaml; --preset and --config "
                             f"do not apply (change single fields with --section.field VALUE)")
        if not (run_dir / "config.yaml").exists():
            raise ValueError(f"--resume {run_dir}: no config.yaml there; is it a run folder?")
        fixed = [k for k in overrides if k not in C.resumable()]
        if fixed:  # the run's data, groups, seeds and folder are what its checkpoint was made with
            raise ValueError(f"--resume {run_dir}: {', '.join(fixed)} cannot change within a run; --resume may "
                             f"change {', '.join(C.resumable())}")
        cfg = C.load("frozenlake", str(run_dir / "config.yaml"), overrides, run_config=True)
        _refuse_missing(cfg)
        return cfg, run_dir, True
    preset = args.preset or DEFAULT_PRESET
    cfg = C.load(preset, args.config, overrides)
    _refuse_missing(cfg)
    run_dir = run_dir_for(cfg, preset)
    if check_folder:
        check_free(run_dir)
    return cfg, run_dir, False


def _refuse_missing(cfg: C.Config) -> None:
    """What this machine lacks for cfg (vLLM, flash-attn, the generation worker's device), refused
    before anything is built."""
    from .config.checks import device_refusal, missing_install

    missing = missing_install(cfg) or device_refusal(cfg)
    if missing:
        raise ValueError(missing)


def check_free(run_dir: Path) -> None:
    if holds_run(run_dir):
        raise ValueError(f"run folder {run_dir} already holds a run: continue it with --resume {run_dir}, "
                         f"name a new one with --train.name, or remove the folder")


def start(cfg: C.Config, run_dir: Path, resume: bool, new_dir: bool, dist=None):
    """A Trainer. If building it fails and `new_dir` (this command made the run folder), the
    half-made folder is removed and the log says so; an existing or resumed folder is kept."""
    import shutil

    from .dist import SINGLE
    from .train.loop import Trainer

    dist = dist or SINGLE
    try:
        return Trainer(cfg, run_dir, resume=resume, dist=dist)
    except BaseException:
        if new_dir and not resume and dist.main:
            shutil.rmtree(run_dir, ignore_errors=True)
            logging.getLogger("freshper").error("start failed; removed the half-made run folder %s", run_dir)
        raise


DEFAULT_PRESET = "smollm2-135m-math"


def _usage(prog: str, args: str) -> str:
    """`prog args` wrapped to the help's width after "usage: ", never inside a [bracket]."""
    glued = re.sub(r"\[[^]]*\]", lambda m: m[0].replace(" ", "\0"), f"{prog} {args}")
    return textwrap.fill(glued, WIDTH - len("usage: "), subsequent_indent=" " * (len(prog) + 1)).replace("\0", " ")


def _train_parser(prog: str, argv=(), own=None, usage: str = "") -> argparse.ArgumentParser:
    """train/profile's parser: --preset/--config/--resume, `own(p)` adds the command's flags, then
    one flag per config field, its help showing the value the chosen preset sets."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--preset", default=DEFAULT_PRESET)
    preset = pre.parse_known_args(list(argv))[0].preset
    p = argparse.ArgumentParser(prog=prog, formatter_class=Formatter, allow_abbrev=False, epilog=presets_epilog(),
                                usage=_usage(prog, f"{usage}[--preset NAME] [--config YAML] [--resume RUN_DIR] "
                                                   f"[--section.field VALUE ...]"))
    p.add_argument("--preset", help=f"default {DEFAULT_PRESET}; every preset is listed at the end")
    p.add_argument("--config", help="a YAML file of {section: {field: value}}")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    if own is not None:
        own(p)
    add_config_flags(p, preset if preset in C.PRESETS else DEFAULT_PRESET)
    return p


def one_process_refusal(what: str) -> str | None:
    """Why a command that runs as one process refuses to run under torchrun (None: it may run)."""
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        return (f"WORLD_SIZE={world}: {what} runs as one process; run it without torchrun "
                f"(freshper train is the command that runs on several ranks)")
    return None


def cmd_train(argv) -> int:
    """One process, or every rank of a torchrun job: rank 0 checks and locks the run folder and
    its verdict reaches all ranks before anything is written."""
    from . import dist as D
    from .dist import check_world

    p = train_parser(argv)
    args, rest = p.parse_known_args(argv)
    world = D.from_env().world
    try:
        cfg, run_dir, resume = build_config(args, rest, check_folder=False)
        check_world(cfg, world)
    except ValueError as e:
        p.error(str(e))
    d = D.init(cfg.train.device)
    new_dir, lock, err = not run_dir.exists(), None, None  # new_dir: decided before logging creates it
    if d.main:
        try:
            if not resume:
                check_free(run_dir)
            lock = RunLock(run_dir)
        except ValueError as e:
            err = str(e)
    err = d.broadcast(err)
    if err:
        D.close(d)
        if d.main:
            p.error(err)
        return 2
    trainer, done = None, False
    try:
        with logging_to(run_dir, d.rank):
            try:
                trainer = start(cfg, run_dir, resume, new_dir, d)
            except KeyboardInterrupt:
                print("freshper train: interrupted before training started", file=sys.stderr)
                return 130
            except ValueError as e:  # a setting the checkpoint refuses: one line, in train.log too
                logging.getLogger("freshper").error("freshper train: %s", e)
                return 2
            if resume and trainer.iteration >= cfg.train.iterations:
                logging.getLogger("freshper").warning(
                    "nothing to do: %s finished at iteration %d (train.iterations %d); to train on, raise it: "
                    "freshper train --resume %s --train.iterations N", run_dir, trainer.iteration,
                    cfg.train.iterations, run_dir)
            from .train.async_worker import GenerationWorkerDied

            try:
                trainer.run()
            except KeyboardInterrupt:  # a second stop signal, or the stuck-iteration watchdog
                logging.getLogger("freshper").error(
                    "freshper train: aborted in iteration %d without a checkpoint; resume from the latest with: "
                    "freshper train --resume %s", trainer.iteration, run_dir)
                return 130
            except ValueError as e:  # bad input found mid-run (a user's env or reward): one line, no traceback
                logging.getLogger("freshper").error("freshper train: error in iteration %d: %s", trainer.iteration, e)
                logging.getLogger("freshper").debug("where it was raised", exc_info=True)
                return 2
            except GenerationWorkerDied as e:  # rollout.asynchronous: the checkpoint is written, the worker gone
                logging.getLogger("freshper").error("freshper train: stopped in iteration %d: %s; resume with: "
                                                    "freshper train --resume %s", trainer.iteration, e, run_dir)
                return 3
            interrupted, done = trainer.interrupted, True
    finally:
        # The sharded model, its device mesh and the samplers hold the process group: drop them
        # before the group, or gloo's worker threads are torn down at interpreter exit (SIGABRT).
        trainer = None
        import gc

        gc.collect()
        if lock is not None:
            lock.release()
        D.close(d, wait=done)
    code = 130 if interrupted else 0
    if d.on:  # a rank ends here, skipping interpreter finalisation, where gloo's threads may abort it
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def train_parser(argv=()) -> argparse.ArgumentParser:
    """`freshper train`'s parser (its help shows the defaults of the preset `argv` names)."""
    return _train_parser("freshper train", argv)


def profile_parser(argv=()) -> argparse.ArgumentParser:
    """`freshper profile`'s parser: train's, and the iterations to profile."""

    def own(p):
        p.add_argument("--iterations", required=True, metavar="S:E", help="profile iterations S..E (inclusive)")
        p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # set when re-launched under nsys

    return _train_parser("freshper profile", argv, own, usage="--iterations S:E ")


def cmd_profile(argv) -> int:
    """`freshper profile [train args] --iterations S:E`: Nsight Systems on CUDA, torch.profiler on CPU."""
    import subprocess

    import torch

    from freshper.profiling import nsight

    p = profile_parser(argv)
    args, rest = p.parse_known_args(argv)
    if why := one_process_refusal("freshper profile"):
        p.error(why)
    try:
        first, last = nsight.parse_window(args.iterations)
        cfg, run_dir, resume = build_config(args, rest)
    except ValueError as e:
        p.error(str(e))
    if last >= cfg.train.iterations:
        p.error(f"--iterations {args.iterations} ends after train.iterations={cfg.train.iterations}")
    cuda = torch.cuda.is_available() and cfg.train.device != "cpu"
    if cuda and not args.child:
        out = run_dir / "profile" / f"iters_{first}_{last}"
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = nsight.nsys_command(out, [sys.executable, "-m", "freshper.trainer.cli", "profile", "--child", *argv])
        print("running:", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
        print(f"Nsight Systems report: {out}.nsys-rep (open with nsys-ui, or `nsys stats {out}.nsys-rep`)")
        return rc
    trace = run_dir / "profile" / f"trace_iters_{first}_{last}.json"
    hook = nsight.CudaWindow(first, last) if cuda else nsight.CpuWindow(first, last, trace)
    new_dir = not run_dir.exists()
    with logging_to(run_dir):
        trainer = start(cfg, run_dir, resume, new_dir)
        trainer.run(iterations=last + 1 - trainer.iteration, on_iteration=hook)
    if not cuda:
        print(f"torch.profiler Chrome trace: {trace} (open in chrome://tracing or ui.perfetto.dev)")
    return 0


def plot_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="freshper plot", description="draw RUN_DIR/learning_curve.png")
    p.add_argument("run_dir")
    p.add_argument("--out", help="PNG path (default RUN_DIR/learning_curve.png)")
    return p


def cmd_plot(argv) -> int:
    p = plot_parser()
    args = p.parse_args(argv)
    from .train.metrics import plot

    try:
        print(plot(args.run_dir, args.out))
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    return 0


def cmd_compare(argv) -> int:
    from .study.compare import main as compare_main

    return compare_main(argv)


def cmd_chance(argv) -> int:
    from .study.chance import main as chance_main

    return chance_main(argv)


def export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="freshper export", description="a run's checkpoint as a Hugging Face folder "
                                "(config.json, safetensors, tokenizer, chat template)")
    p.add_argument("run_dir")
    p.add_argument("out")
    p.add_argument("--iteration", type=int, help="checkpoint iteration (default: the latest)")
    p.add_argument("--force", action="store_true", help="write into OUT even if it holds files")
    return p


def cmd_export(argv) -> int:
    p = export_parser()
    args = p.parse_args(argv)
    from .train.checkpoint import CheckpointError
    from .train.export import export

    try:
        print(export(args.run_dir, args.out, args.iteration, overwrite=args.force))
    except (CheckpointError, ValueError, FileNotFoundError) as e:
        p.error(str(e))
    return 0


def eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="freshper eval", description=cmd_eval.__doc__, formatter_class=Formatter,
                                allow_abbrev=False)
    p.add_argument("target", help="a run folder (its latest checkpoint, or --iteration N) or a Hugging Face model "
                                  "folder (config.json)")
    p.add_argument("--preset", help=f"the task (default: the run's own config; for a model folder {DEFAULT_PRESET})")
    p.add_argument("--iteration", type=int, help="a run's checkpoint (default: the latest)")
    # --samples (eval.samples) and the other fields come from add_config_flags: one flag per field
    add_config_flags(p)
    return p


def cmd_eval(argv) -> int:
    """The validation rollout of a run's checkpoint or of a model folder, with 95% intervals."""
    import tempfile

    p = eval_parser()
    args, rest = p.parse_known_args(argv)
    target = Path(args.target)
    is_run = (target / "checkpoints").is_dir() and (target / "config.yaml").exists()
    if not is_run and not (target / "config.json").exists():
        p.error(f"{target} is neither a run folder (checkpoints/, config.yaml) nor a model folder (config.json)")
    from .train.export import export

    with tempfile.TemporaryDirectory() as tmp:
        try:
            model = export(target, Path(tmp) / "model", args.iteration) if is_run else target
            over = config_overrides(args, rest)
            over.update({"model.path": str(model), "algo.mode": "on-policy", "train.sft_steps": 0,
                         "train.progress": False, "train.run_dir": tmp, "train.name": "eval", "train.log_to": ""})
            config_file = str(target / "config.yaml") if is_run and not args.preset else None
            cfg = C.load(args.preset or ("frozenlake" if config_file else DEFAULT_PRESET), config_file, over,
                         run_config=config_file is not None)
        except ValueError as e:
            p.error(str(e))
        from .train.loop import Trainer

        ev = Trainer(cfg, Path(tmp) / "eval").evaluate()
    e = cfg.eval
    from .train.intervals import wilson_half

    n, pk = e.episodes, ev["eval_pass_at_k"]
    score_half = ev["eval_score_ci95"]
    spread = "— (every state scored alike)" if not score_half > 0 else f"{score_half:.3f} (95%)"
    print(f"{target}: {e.episodes} validation states x {e.samples} replies at temperature {e.temperature}")
    print(f"  eval_success (avg@{e.samples})  {ev['eval_success']:.3f} ± {ev['eval_success_ci95']:.3f} (95%)")
    print(f"  eval_score            {ev['eval_score']:.3f} ± {spread}")
    print(f"  eval_pass_at_{e.samples}       {pk:.3f} ± {wilson_half(pk, n):.3f} (95%)")
    print(f"  valid answers {ev['eval_valid_action']:.3f}, context ended {ev['eval_context_ended']:.3f}")
    return 0


COMMANDS = {"train": cmd_train, "plot": cmd_plot, "profile": cmd_profile, "compare": cmd_compare,
            "chance": cmd_chance, "export": cmd_export, "eval": cmd_eval}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: freshper {{{','.join(COMMANDS)}}} ...\n\n{__doc__}")
        return 0 if argv else 2
    cmd = argv[0]
    if cmd not in COMMANDS:
        print(f"freshper: unknown command {cmd!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    why = one_process_refusal(f"freshper {cmd}") if cmd in ("compare", "chance", "export", "eval", "plot") else None
    if why:
        print(f"freshper {cmd}: {why}", file=sys.stderr)
        return 2
    return COMMANDS[cmd](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
