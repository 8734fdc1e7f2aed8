"""Compile the project's Triton kernels for CUDA on a machine without a GPU, and read what the
GPU would run: registers, local memory (spills) and shared memory per kernel, from the cubin.

Triton compiles for a named target without a driver (`triton.compile(ASTSource(...),
target=GPUTarget("cuda", 90, 32))`; its wheel ships ptxas and cuobjdump), so compile errors,
register pressure and spills show on the CPU machine. Each launch is compiled with the hints
Triton's launcher gives a real one: every pointer 16-byte aligned (torch's allocations, and the
chunk offsets the code launches at, are) and each int argument whose value at the real launch is
known specialized as that launcher does (divisible by 16: a divisibility hint; 1: a constant).
Without them the compiler cannot prove vector loads safe, and reports another binary (the row
kernel: 158-160 registers with scalar loads, against 123 with vector loads under Triton 3.6).
`launches()` lists every kernel with the configurations the code actually launches (the
sampler's plan from 1e2 slots to its limit, the policy-loss blocks with and without each
option, fp32/bf16/fp64 inputs); tests/kernels/test_compile_cuda.py compiles them all for sm_90
and sm_80.

    python -m freshper.profiling.compile_cuda [--arch 90] [--kernel _rows] [--no-hints]   # the table
"""
from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# Shared memory a block may use, by compute capability (CUDA programming guide, opt-in maxima).
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}


@dataclass
class Launch:
    """One kernel configuration: the @triton.jit function, its signature (name -> Triton type,
    "constexpr" for compile-time constants), the constexpr values, and the values of the int
    arguments at a real launch where the launcher would specialize on them (name -> int)."""

    name: str
    fn: object
    signature: dict
    constexprs: dict
    ints: dict = field(default_factory=dict)


@dataclass
class Resources:
    regs: int  # registers per thread
    stack: int  # bytes of local memory per thread (register spills and local arrays)
    shared: int  # bytes of shared memory per block
    num_warps: int
    vector_loads: int = 0  # global loads of 2 or 4 elements at once in the PTX (ld.global.v2 / .v4)


def _cuobjdump() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def launch_hints(launch: Launch) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) as Triton's launcher builds them for a real launch of
    `launch`: pointers 16-byte aligned ("tt.divisibility" 16), ints known to be divisible by 16
    likewise, ints known to be 1 made constants. Keys of attrs are (argument index,), in the
    kernel's parameter order, as the launcher's are."""
    names = list(launch.fn.arg_names)
    unknown = set(launch.ints) - set(launch.signature)
    if unknown:
        raise ValueError(f"{launch.name}: ints names arguments not in the signature: {sorted(unknown)}")
    full = {**launch.signature, **{k: "constexpr" for k in launch.constexprs}}
    if set(full) != set(names):
        raise ValueError(f"{launch.name}: the signature must name every parameter of {launch.fn.__name__} "
                         f"{names}, got {sorted(full)}")
    sig, const, attrs = {}, dict(launch.constexprs), {}
    for i, name in enumerate(names):
        kind = full[name]
        value = launch.ints.get(name)
        if kind.startswith("*"):
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif value == 1 and kind.startswith(("i", "u")):
            kind, const[name] = "constexpr", 1
        elif value is not None and value % 16 == 0:
            attrs[(i,)] = [["tt.divisibility", 16]]
        sig[name] = kind
    return sig, const, attrs


def compile_launch(launch: Launch, arch: int = 90, hints: bool = True) -> Resources:
    """Compile `launch` for sm_<arch> with Triton's own compiler and ptxas, with a real launch's
    hints (`launch_hints`; hints=False: none, the binary a launch of unaligned pointers gets);
    raise on a compile error; return what the cubin says it needs."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if hints:
        sig, const, attrs = launch_hints(launch)
    else:
        sig = {**launch.signature, **{k: "constexpr" for k in launch.constexprs}}
        const, attrs = launch.constexprs, {}
    src = ASTSource(fn=launch.fn, signature=sig, constexprs=const, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(_cuobjdump()), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if m is None:
        raise RuntimeError(f"cuobjdump printed no resource usage for {launch.name}:\n{out}")
    regs, stack, shared, local = map(int, m.groups())
    vec = len(re.findall(r"ld\.global(?:\.\w+)*\.v[24]\.", kernel.asm["ptx"]))
    return Resources(regs, stack + local, max(shared, int(kernel.metadata.shared)), int(kernel.metadata.num_warps),
                     vec)


def sampler_launches(n: int, draws: int, block: int | None = None) -> list[Launch]:
    """The three sampler launches as `sample_triton` plans them for n keys and `draws` draws,
    compiled as on a GPU (the plan's compiled tile sizes, not the interpreter's)."""
    from freshper.kernels import sampler as S

    block, sub, nb, d, chunk = S._plan(n, draws, block, compiled=True)
    f64, i32 = "*fp64", "i32"
    tag = f"n={n:.0e} B={draws}" + (f" block={block}" if block else "")
    return [
        Launch(f"_block_stats {tag}", S._block_stats, dict(keys_ptr=f64, n=i32, bmax_ptr=f64, bsum_ptr=f64,
                                                           bmin_ptr=f64, sub_ptr=f64), dict(BLOCK=block, SUB=sub),
               dict(n=n)),
        Launch(f"_block_scan {tag}", S._block_scan, dict(bmax_ptr=f64, bsum_ptr=f64, bmin_ptr=f64, nb=i32,
                                                         prefix_ptr=f64, owner_ptr="*i32", scal_ptr=f64,
                                                         err_ptr="*i32"),
               dict(HAS_ERR=True, CHUNK=chunk), dict(nb=nb)),
        Launch(f"_search {tag}", S._search, dict(keys_ptr=f64, n=i32, bmax_ptr=f64, bsum_ptr=f64, prefix_ptr=f64,
                                                 owner_ptr="*i32", sub_ptr=f64, scal_ptr=f64, nb=i32, n_steps=i32,
                                                 u_ptr=f64, n_draws=i32, idx_ptr="*i64", prob_ptr=f64, w_ptr=f64),
               dict(BLOCK=block, SUB=sub, NSUB=block // sub, DRAWS=d),
               dict(n=n, nb=nb, n_steps=nb.bit_length(), n_draws=draws)),
    ]


def policy_loss_launches() -> list[Launch]:
    """The policy-loss kernel with every option combination (fp32), the other input dtypes with
    every option on, and the smallest and largest token blocks."""
    L = importlib.import_module("freshper.kernels.policy_loss")  # the package re-exports a function of that name

    def one(dt, has_w, has_kl, has_tis, block_t, mask="*u8", cispo=False):
        sig = dict(logp_ptr=dt, old_ptr=dt, adv_ptr="*fp32", mask_ptr=mask, w_ptr="*fp32", ref_ptr=dt, tis_ptr=dt,
                   dl_ptr="*fp32", part_ptr="*fp32", T="i32", stride_lp="i32", stride_old="i32",
                   stride_adv_b="i32", stride_adv_t="i32", stride_mask="i32", stride_ref="i32", stride_tis="i32",
                   stride_dl="i32", clip_low="fp32", clip_high="fp32", kl_coef="fp32", tis_cap="fp32")
        const = dict(HAS_W=has_w, HAS_KL=has_kl, HAS_TIS=has_tis, CISPO=cispo, BLOCK_T=block_t)
        name = (f"_policy_loss_fwd {dt[1:]} w={int(has_w)} kl={int(has_kl)} tis={int(has_tis)} T={block_t} "
                f"mask={mask[1:]}{' cispo' if cispo else ''}")
        T = 1024  # a (B, 1024) batch, row-major, (B, T) advantages: the launcher's view of the ints
        ints = dict(T=T, stride_lp=T, stride_old=T, stride_adv_b=T, stride_adv_t=1, stride_mask=T, stride_ref=T,
                    stride_tis=T, stride_dl=T)
        return Launch(name, L._policy_loss_fwd, sig, const, ints)

    out = [one("*fp32", w, kl, tis, 1024) for w in (False, True) for kl in (False, True) for tis in (False, True)]
    out += [one(dt, True, True, True, 1024) for dt in ("*bf16", "*fp16", "*fp64")]
    out += [one("*fp32", True, True, True, 16), one("*bf16", True, True, True, 16, mask="*fp32")]
    out += [one(dt, True, True, True, 1024, cispo=True) for dt in ("*fp32", "*bf16")]
    return out


ROWS_VOCAB = 151_936  # Qwen2.5's: the row kernel's int arguments (V, row strides) at its real launch


def logit_rows_launches() -> list[Launch]:
    """The LM-head row kernel in each mode, for bf16 / fp32 / fp64 logits written in place, every
    loss option on, at the largest column block (4,096, what V >= 4,096 gets) and a small one;
    and fp32 logits writing a bf16 gradient into their own memory (the float32-logits path on
    CUDA: row stride 2 V in bf16 elements). V and the strides are Qwen2.5's."""
    from freshper.kernels import logit_rows as R

    def one(zt, mode, block_v, own=False, cispo=False, dt=None):
        f32 = "*fp32"
        sig = dict(z_ptr=zt, stride_z="i32", d_ptr=dt or zt, stride_d="i32", y_ptr="*i64", V="i32", lse_ptr=f32,
                   logp_ptr=f32, g_ptr=f32, old_ptr=f32, adv_ptr=f32, scale_ptr=f32, coef_ptr=f32, ref_ptr=f32,
                   tis_ptr=f32, terms_ptr=f32, clip_low="fp32", clip_high="fp32", kl_coef="fp32", tis_cap="fp32")
        const = dict(MODE=R.MODES.index(mode), OWN=own, HAS_KL=True, HAS_TIS=True, CISPO=cispo,
                     PACKED=dt is not None, BLOCK_V=block_v)
        V = ROWS_VOCAB
        ints = dict(V=V, stride_z=V, stride_d=2 * V if dt else V)
        name = (f"_rows {zt[1:]}{'->' + dt[1:] if dt else ''} {mode} V-block={block_v}{' own' if own else ''}"
                f"{' cispo' if cispo else ''}")
        return Launch(name, R._rows, sig, const, ints)

    out = [one(zt, mode, 4096) for zt in ("*bf16", "*fp32") for mode in R.MODES]
    out += [one("*fp32", mode, 4096, dt="*bf16") for mode in ("loss", "given")]
    out += [one("*fp64", "loss", 4096), one("*bf16", "loss", 4096, own=True, cispo=True), one("*bf16", "loss", 64)]
    return out


def slot_write_launches() -> list[Launch]:
    """The replay buffer's write kernel for add (stamp, at the max or not) and update (live slots
    required), at the smallest and largest batch blocks; and the sync-free add (given births,
    the owner's counters advanced and the step and boost step set by the write)."""
    from freshper.kernels import slot_write as W

    sig = dict(slots_ptr="*i64", p_ptr="*fp64", at_ptr="*fp64", active_ptr="*i1", born_ptr="*i64", n="i32",
               cap="i32", step="i64", cfg_ptr="*fp64", log_base_ptr="*fp64", birth_ptr="*i64", live_ptr="*i8",
               keys_ptr="*fp64", own_ptr="*fp64", boosted_ptr="*i8", scratch_ptr="*i64", err_ptr="*i32",
               max_p_ptr="*fp64", size_ptr="*i64", ctr_ptr="*i64")
    out = []
    for block in (16, 256):  # the smallest and largest batch blocks write_slots_triton launches
        for stamp, need_live, at, active, owner in ((True, False, False, False, False),
                                                    (True, False, True, False, False),
                                                    (False, True, False, False, False),
                                                    (False, False, False, True, False),
                                                    (True, False, False, False, True)):
            const = dict(MODE=2, ZERO_OK=True, STAMP=stamp, NEED_LIVE=need_live, HAS_ACTIVE=active,
                         HAS_BORN=owner, SET_OWN=True, BOOST=0, RAISE_MAX=True, AT=at, ADVANCE=owner,
                         SET_STEP=owner, BOOST_STEP=W.BOOST_STEPS["set" if owner else None], BLOCK=block)
            out.append(Launch(f"_write B={block} stamp={int(stamp)} live={int(need_live)} at={int(at)} "
                              f"active={int(active)} owner={int(owner)}", W._write, sig, const))
    return out


# Sizes the sampler is compiled at: from 1e2 slots to its limit, one draw to many.
SAMPLER_SIZES = [(100, 1), (100, 256), (10**4, 256), (10**5, 256), (10**6, 256), (10**6, 4096), (10**7, 256),
                 (2**31 - 1, 1024)]
SAMPLER_BLOCKS = [16, 64, 128, 1024]  # explicit first-level blocks the tests pass


def launches() -> list[Launch]:
    """Every distinct kernel configuration the code launches (deduplicated by constexprs)."""
    seen, out = set(), []
    cands = [x for n, b in SAMPLER_SIZES for x in sampler_launches(n, b)]
    cands += [x for blk in SAMPLER_BLOCKS for x in sampler_launches(5000, 256, blk)]
    for x in cands + policy_loss_launches() + logit_rows_launches() + slot_write_launches():
        key = (x.fn, tuple(sorted(x.signature.items())), tuple(sorted(x.constexprs.items())))
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


def main(argv=None) -> int:
    import json
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter has no compiler to ask")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, action="append", help="compute capability x10 (default 90 and 80)")
    p.add_argument("--json", action="store_true", help="one JSON list on stdout, for the tests")
    p.add_argument("--kernel", help="only launches whose name contains this text")
    p.add_argument("--no-hints", action="store_true", help="compile without a real launch's alignment hints")
    args = p.parse_args(argv)
    rows = []
    for arch in args.arch or [90, 80]:
        for x in launches():
            if args.kernel and args.kernel not in x.name:
                continue
            try:
                r = compile_launch(x, arch, hints=not args.no_hints)
                rows.append({"name": x.name, "arch": arch, "regs": r.regs, "stack": r.stack, "shared": r.shared,
                             "num_warps": r.num_warps, "vector_loads": r.vector_loads, "error": None})
            except Exception as e:  # a compile error is a result here, reported per kernel
                rows.append({"name": x.name, "arch": arch, "error": f"{type(e).__name__}: {str(e)[-400:]}"})
    if args.json:
        print(json.dumps(rows))
        return 0
    import triton

    print(f"triton {triton.__version__}: registers per thread, local memory (spills) and shared memory per block")
    print(f"hints: {'none' if args.no_hints else 'a real launch (16-byte pointers, ints specialized)'}")
    print("| kernel | sm | regs | local B | shared B | warps | vector loads |\n|---|---|---|---|---|---|---|")
    for r in rows:
        if r["error"]:
            print(f"| {r['name']} | {r['arch']} | compile error: {r['error'][:80]} | | | | |")
        else:
            print(f"| {r['name']} | {r['arch']} | {r['regs']} | {r['stack']} | {r['shared']} | {r['num_warps']} | "
                  f"{r['vector_loads']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
