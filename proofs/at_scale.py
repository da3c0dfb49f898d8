"""At scale: the training verdicts rerun on a larger model of the same shared code, on real text.

    python -m proofs.at_scale                  # the `gpu` preset if CUDA is there, else `cpu`
    python -m proofs.at_scale --preset tiny    # seconds: a test of the runner (CI runs it)
    make at-scale                              # the same as the first line

The toy proofs answer each question on a synthetic task in seconds. A skeptical reader asks whether the
verdict survives a real model. This runner takes the switches those proofs flip (1/sqrt(d_k), Pre- vs Post-LN,
SwiGLU, RMSNorm, tying, the parallel block, GQA/MQA, RoPE/ALiBi, label smoothing, dropout), sets each on the
same shared DecoderLM, byte-level, about 100x larger (the `gpu` preset: d_model 512, 8 layers, 8 heads, context
256: about 25M parameters), trains every arm on the same batches for the same number of steps, and measures
held-out loss in nats per byte on files it never trained on, plus what each page's mechanism needs (attention
entropy and largest logit, divergence, loss at 2x and 4x the training length, calibration, the train-val gap).

Every arm runs at two or more seeds and the baseline at more, so each difference is shown beside the baseline's
own seed-to-seed spread. The number of steps is set once per run from a timed calibration of the baseline, so the
whole run fits its preset's time budget and every arm trains exactly as long as the others.

The corpus is the running interpreter's standard library source (`.py` files, test suites left out): code, some
12 MB, present wherever Python is, so nothing is downloaded. Whole files are held out (every tenth by a hash of its
path), so validation text was never seen in training. Its name, size and sha256 go into the record.

The record (bench/at_scale/<preset>.json, committed like the seed records) holds the preset, device, torch
version, corpus identity, steps, seeds, every run's measurements, the code fingerprint and the date. The pages'
"At scale" boxes are rendered from it (docs/hooks/evidence.py), never typed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from proofs import evidence as E
from proofs.scale_record import CACHE, RECORDS, training_fingerprint
from proofs.transformer import DecoderLM, TransformerConfig, record_attention
from proofs.transformer.attention import MultiHeadAttention, causal_mask

SLACK = 1.45  # planned seconds per run / (steps x baseline seconds per step): slower arms, evaluation, start-up
VOCAB = 256  # byte-level: every byte is a token, so the loss is in nats per byte


# --- presets -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    name: str
    d_model: int  # width of the residual stream
    n_layers: int  # decoder layers
    n_heads: int  # query heads (d_k = d_model / n_heads)
    context: int  # training length in bytes; evaluated at 1x, 2x and 4x
    batch: int  # sequences per step
    budget_s: float  # wall-clock seconds for all training (calibration included); the steps follow from it
    workers: int  # processes sharing the device (small models leave a GPU idle between kernels)
    seeds: tuple[int, ...]  # seeds of every arm
    base_seeds: tuple[int, ...]  # seeds of the baseline (more: its spread is the noise every difference is read against)
    eval_bytes: int  # held-out bytes scored per length (split into windows of that length)
    lr: float  # AdamW peak learning rate of every arm but the high-learning-rate pair
    hi_lr: float  # the Pre-/Post-LN pair's learning rate, reached without warm-up
    min_steps: int = 1  # refuse to run (too little budget) below this
    max_steps: int = 100_000  # cap on the steps the budget gives
    fixed_steps: int = 0  # > 0: no timing, every run trains exactly this many steps (the tiny preset)
    corpus_bytes: int = 0  # 0 = the whole corpus; the tiny preset reads a slice
    bf16: bool = False  # autocast matrix products to bfloat16 (CUDA)


PRESETS = {
    "gpu": Preset("gpu", d_model=512, n_layers=8, n_heads=8, context=256, batch=64, budget_s=420.0, workers=4,
                  seeds=(0, 1), base_seeds=(0, 1, 2, 3), eval_bytes=262_144, lr=1e-3, hi_lr=3e-3, min_steps=200,
                  bf16=True),
    "cpu": Preset("cpu", d_model=128, n_layers=4, n_heads=4, context=128, batch=8, budget_s=1500.0, workers=1,
                  seeds=(0, 1), base_seeds=(0, 1, 2, 3), eval_bytes=32_768, lr=2e-3, hi_lr=6e-3, min_steps=100),
    "tiny": Preset("tiny", d_model=32, n_layers=2, n_heads=4, context=32, batch=8, budget_s=60.0, workers=1,
                   seeds=(0, 1), base_seeds=(0, 1, 2), eval_bytes=2048, lr=3e-3, hi_lr=1e-2, fixed_steps=12,
                   corpus_bytes=400_000),
}


# --- arms: one switch each, named after the page that asks about it ------------------------------------
@dataclass(frozen=True)
class Arm:
    switches: dict = field(default_factory=dict)  # TransformerConfig fields this arm changes
    label_smoothing: float = 0.0
    zero_norm_bias: bool = False  # every LayerNorm's bias fixed at 0 (the toy's intervention, proof_rmsnorm)
    high_lr: bool = False  # the preset's hi_lr with no warm-up and no clipping (the Pre-/Post-LN question)
    what: str = ""


def arms(p: Preset) -> dict[str, Arm]:
    d = p.d_model
    return {
        "base": Arm(what="Pre-LN, LayerNorm, ReLU FFN 4d, sinusoidal, tied, MHA, 1/sqrt(d_k), no dropout"),
        "no_scale": Arm({"attn_scale": "none"}, what="q.k not divided by sqrt(d_k)"),
        "swiglu": Arm({"ffn_gated": True, "activation": "silu", "d_ff": 8 * d // 3}, what="SwiGLU at 8/3 d"),
        "rmsnorm": Arm({"norm": "rms"}, what="RMSNorm instead of LayerNorm"),
        "ln_no_bias": Arm(zero_norm_bias=True, what="LayerNorm with its bias fixed at 0"),
        "untied": Arm({"tie_embeddings": "none"}, what="separate input embedding and output projection"),
        "parallel": Arm({"parallel_block": True}, what="attention and FFN read the same normed input"),
        "gqa": Arm({"n_kv_heads": max(1, p.n_heads // 4)}, what="grouped-query attention, n_heads/4 KV heads"),
        "mqa": Arm({"n_kv_heads": 1}, what="multi-query attention, one KV head"),
        "rope": Arm({"positions": "rope", "rope_layout": "half"}, what="rotary positions"),
        "alibi": Arm({"positions": "alibi"}, what="ALiBi biases, no position vectors"),
        "label_smoothing": Arm(label_smoothing=0.1, what="label smoothing 0.1"),
        "dropout": Arm({"dropout_emb": 0.1, "dropout_residual": 0.1}, what="dropout 0.1 (paper's two sites)"),
        "pre_hi_lr": Arm(high_lr=True, what="Pre-LN at the high learning rate, no warm-up"),
        "post_hi_lr": Arm({"norm_position": "post"}, high_lr=True, what="Post-LN at the high learning rate, no warm-up"),
    }


def base_config(p: Preset) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=VOCAB, d_model=p.d_model, n_heads=p.n_heads, d_ff=4 * p.d_model, n_layers=p.n_layers,
        max_len=4 * p.context, norm_position="pre", positions="sinusoidal", tie_embeddings="all",
        dropout_emb=0.0, dropout_residual=0.0,
    )


# --- the corpus ------------------------------------------------------------------------------------------
def stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = sorted(f for f in root.rglob("*.py") if not skip & set(f.relative_to(root).parts))
    return root, files


def build_corpus(out: Path) -> dict:
    """Concatenate the standard library's source into train and val byte files; return their identity."""
    root, files = stdlib_files()
    if not files:
        raise SystemExit(f"no .py files under {root}: this interpreter ships no standard library source")
    parts: dict[str, list[bytes]] = {"train": [], "val": []}
    for f in files:
        rel = f.relative_to(root).as_posix()
        split = "val" if zlib.crc32(rel.encode()) % 10 == 0 else "train"  # whole files held out
        parts[split].append(f"# ---- {rel}\n".encode() + f.read_bytes() + b"\n")
    out.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    sizes = {}
    for split in ("train", "val"):
        data = b"".join(parts[split])
        (out / f"{split}.bin").write_bytes(data)
        h.update(data)
        sizes[split] = len(data)
    ident = {"name": f"CPython {platform.python_version()} standard library source (.py files, test suites left out)",
             "files": len(files), "val_files": len(parts["val"]), "bytes": sum(sizes.values()),
             "train_bytes": sizes["train"], "val_bytes": sizes["val"], "sha256": h.hexdigest(),
             "split": "whole files: crc32(path) % 10 == 0 held out"}
    (out / "corpus.json").write_text(json.dumps(ident, indent=1))
    return ident


def unigram_nats(data: bytes) -> float:
    """Entropy of the byte frequencies: the held-out loss of a model that learned how often each byte occurs and
    nothing else (where a stalled run sits)."""
    counts = torch.bincount(torch.frombuffer(bytearray(data), dtype=torch.uint8).long(), minlength=256)
    freq = counts[counts > 0].double() / counts.sum()
    return float(-(freq * freq.log()).sum())


def corpus(cache: Path = CACHE / "corpus") -> tuple[dict, bytes, bytes]:
    """(identity, train bytes, val bytes), built on first use. A corpus carried in from elsewhere (another
    interpreter's) is used as it is, so two machines can train on the very same bytes."""
    if not (cache / "corpus.json").is_file():
        build_corpus(cache)
    ident = json.loads((cache / "corpus.json").read_text())
    if "unigram_nats_val" not in ident:
        ident["unigram_nats_val"] = unigram_nats((cache / "val.bin").read_bytes())
        (cache / "corpus.json").write_text(json.dumps(ident, indent=1))
    return ident, (cache / "train.bin").read_bytes(), (cache / "val.bin").read_bytes()


# --- one run ---------------------------------------------------------------------------------------------
def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to the peak, then cosine decay to a tenth of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def windows(data: torch.Tensor, length: int, total: int) -> torch.Tensor:
    """Evenly spaced (n, length + 1) windows covering `total` bytes of `data` (inputs and next-byte targets)."""
    n = max(1, total // length)
    starts = torch.linspace(0, len(data) - length - 2, n, device=data.device).long()
    return data[starts[:, None] + torch.arange(length + 1, device=data.device)]


@torch.no_grad()
def score(model: nn.Module, win: torch.Tensor, ctx: int, bf16: bool, chunk: int = 64) -> dict:
    """Mean next-byte loss (nats per byte) over windows, and over the positions past the training length ctx;
    top-1 confidence, accuracy and expected calibration error (15 bins) at the training length."""
    model.eval()
    nll, nll_far, n, n_far, conf_all, hit_all = 0.0, 0.0, 0, 0, [], []
    for i in range(0, len(win), chunk):
        x, y = win[i:i + chunk, :-1], win[i:i + chunk, 1:]
        with torch.autocast(x.device.type, torch.bfloat16, enabled=bf16):
            logits = model(x)
        lp = torch.log_softmax(logits.float(), -1)
        tok = -lp.gather(-1, y[..., None])[..., 0]  # (b, T)
        nll += tok.sum().item()
        n += tok.numel()
        if x.shape[1] > ctx:
            nll_far += tok[:, ctx:].sum().item()
            n_far += tok[:, ctx:].numel()
        else:
            p, guess = lp.exp().max(-1)
            conf_all.append(p.flatten())
            hit_all.append((guess == y).float().flatten())
    out = {"nll": nll / n}
    if n_far:
        out["nll_beyond"] = nll_far / n_far
    if conf_all:
        conf, hit = torch.cat(conf_all), torch.cat(hit_all)
        bins = torch.clamp((conf * 15).long(), max=14)
        ece = sum((bins == b).float().sum() * (conf[bins == b].mean() - hit[bins == b].mean()).abs()
                  for b in range(15) if (bins == b).any()) / len(conf)
        out.update(confidence=conf.mean().item(), accuracy=hit.mean().item(), ece=float(ece))
    return out


@torch.no_grad()
def attention_stats(model: nn.Module, x: torch.Tensor) -> dict:
    """Mean attention entropy (nats, over layers, heads and queries) and the largest pre-softmax logit among the
    keys each query may see, on one batch: the quantities the 1/sqrt(d_k) page reasons about."""
    model.eval()
    largest = []
    mods = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]

    def watch(m: MultiHeadAttention):
        plain = type(m).score

        def s(q, k, pos=None):
            out = plain(m, q, k, pos)  # (B, nh, Tq, Tk)
            hide = causal_mask(out.shape[-2], out.shape[-1], out.device)
            largest.append(out.float().masked_fill(hide, float("-inf")).amax().item())
            return out
        return s

    for m in mods:
        m.score = watch(m)  # an instance attribute shadows the method for this measurement only
    try:
        with record_attention(model) as attn:
            model(x)
            ent = [-(a.float() * a.float().clamp_min(1e-30).log()).sum(-1).mean().item() for a in (m.weights for m in attn)]
    finally:
        for m in mods:
            del m.score
    return {"attn_entropy": statistics.fmean(ent), "largest_logit": max(largest)}


def train_run(p: Preset, arm_name: str, seed: int, steps: int, data: dict, device: str) -> dict:
    """Train one arm at one seed; the batches depend on the seed only, so every arm sees the same ones."""
    arm = arms(p)[arm_name]
    cfg = replace(base_config(p), **arm.switches)
    torch.manual_seed(seed)
    model = DecoderLM(cfg).to(device)
    if arm.zero_norm_bias:
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                nn.init.zeros_(m.bias)
                m.bias.requires_grad_(False)
    params = sum(t.numel() for t in model.parameters() if t.requires_grad)
    decay = [t for t in model.parameters() if t.requires_grad and t.dim() >= 2]
    other = [t for t in model.parameters() if t.requires_grad and t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=p.lr, betas=(0.9, 0.95), eps=1e-8)
    peak = p.hi_lr if arm.high_lr else p.lr
    warmup = 0 if arm.high_lr else max(1, steps // 20)
    clip = None if arm.high_lr else 1.0
    train, val = data["train"], data["val"]
    probe = windows(val, p.context, 8 * p.context)[:, :-1]
    start = attention_stats(model, probe) if arm_name in ("base", "no_scale") else {}
    g = torch.Generator().manual_seed(10_000 + seed)
    curve, diverged, max_gn, t0 = [], False, 0.0, time.time()
    every = max(1, steps // 40)
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak, warmup)
        starts = torch.randint(0, len(train) - p.context - 1, (p.batch,), generator=g).to(device)
        xy = train[starts[:, None] + torch.arange(p.context + 1, device=device)]  # (B, T+1) bytes
        x, y = xy[:, :-1], xy[:, 1:]
        with torch.autocast(x.device.type, torch.bfloat16, enabled=p.bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), label_smoothing=arm.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else float("inf"))
        opt.step()
        if step % every == 0 or step == steps - 1:
            value, gn = loss.item(), gn.item()
            curve.append((step, round(value, 4)))
            max_gn = max(max_gn, gn if math.isfinite(gn) else float("inf"))
            if not math.isfinite(value):
                diverged = True
                break
    seconds = time.time() - t0
    out = {"arm": arm_name, "seed": seed, "params": params, "steps": steps, "seconds": round(seconds, 1),
           "diverged": diverged, "curve": curve, "max_grad_norm": max_gn,
           "kv_values_per_token": 2 * cfg.n_layers * cfg.kv_heads * (cfg.d_model // cfg.n_heads)}
    if diverged:
        return out
    for k, mult in (("val", 1), ("val_2x", 2), ("val_4x", 4)):
        r = score(model, windows(val, mult * p.context, p.eval_bytes), p.context, p.bf16)
        out[k] = r.pop("nll")
        if "nll_beyond" in r:
            out[k + "_beyond"] = r.pop("nll_beyond")
        out.update({f"{k2}" if k == "val" else f"{k}_{k2}": v for k2, v in r.items()})
    out["train_eval"] = score(model, windows(train, p.context, p.eval_bytes), p.context, p.bf16)["nll"]
    if start:
        end = attention_stats(model, probe)
        out.update({f"{k}_init": v for k, v in start.items()}, **end)
    return out


# --- the whole run ------------------------------------------------------------------------------------------
def plan(p: Preset) -> list[tuple[str, int]]:
    """Every (arm, seed) pair, the baseline at its extra seeds too."""
    return [(a, s) for a in arms(p) for s in (p.base_seeds if a == "base" else p.seeds)]


def load_data(p: Preset, device: str) -> tuple[dict, dict]:
    ident, train, val = corpus()
    if p.corpus_bytes:
        train, val = train[:p.corpus_bytes], val[:max(p.corpus_bytes // 8, 8 * p.context * 4 + 2)]
    as_t = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).to(device).long()  # noqa: E731
    return ident, {"train": as_t(train), "val": as_t(val)}


def time_steps(p: Preset, data: dict, device: str, n: int = 12) -> tuple[float, float]:
    """(seconds per baseline training step, seconds to build and evaluate one run), measured the way the runs will
    run. The step: a run of n + 2 steps minus a run of
    2, so model building and the first steps' warm-up cancel out. Evaluation is no part of a step and would drown
    it on a CPU (it scores far more bytes than a few steps train on), so it is stubbed out while timing."""
    g = globals()
    saved = g["score"], g["attention_stats"]
    g["score"], g["attention_stats"] = (lambda *a, **k: {"nll": 0.0}), (lambda *a, **k: {})
    try:
        train_run(p, "base", 0, 2, data, device)  # warm-up: kernels, allocator
        t0 = time.time()
        train_run(p, "base", 0, 2, data, device)
        t1 = time.time()
        train_run(p, "base", 0, n + 2, data, device)
        per_step = max(1e-6, (time.time() - t1) - (t1 - t0)) / n
    finally:
        g["score"], g["attention_stats"] = saved
    t2 = time.time()
    train_run(p, "base", 0, 0, data, device)  # no steps: building the model and evaluating it
    return per_step, time.time() - t2


def steps_for(p: Preset, runs: int, per_step: float, left_s: float, eval_s: float = 0.0) -> int:
    """Steps per run so that `runs` runs, shared by p.workers processes that each take per_step seconds a step
    while all of them run and eval_s seconds a run to build and evaluate, fit in left_s seconds. Measured on the H200 (683-step run): SwiGLU's steps take 1.8x
    the baseline's (its hidden width 1365 is no multiple of 64), RoPE's and RMSNorm's 1.2-1.3x, evaluation a few
    seconds a run: SLACK covers them, and workers take runs from a shared queue so no worker idles while another
    finishes a slow arm."""
    steps = min(p.max_steps, int((left_s * p.workers / runs - eval_s) / (per_step * SLACK)))
    if steps < p.min_steps:
        raise SystemExit(f"preset {p.name}: the budget gives {steps} steps per run at {per_step * 1e3:.0f} ms per step, "
                         f"under its minimum {p.min_steps}; raise --budget or use a smaller preset.")
    return steps


def worker(p: Preset, todo: list, steps: int, device: str, lines: Path, index: int = 0, data: dict | None = None) -> None:
    """Run a share of the plan, appending one JSON line per finished run (partial results survive a timeout).
    steps == 0: first time the baseline's step (while the other workers do the same), write it next to `lines`,
    and wait for the parent to write the number of steps."""
    data = data or load_data(p, device)[1]
    if not steps:
        (lines.parent / f"{lines.name}.cal{index}").write_text(json.dumps(time_steps(p, data, device)))
        told = lines.parent / f"{lines.name}.steps"
        while not told.is_file():
            time.sleep(0.2)
        steps = int(told.read_text())
    for k, (arm, seed) in enumerate(todo):
        try:  # claim run k: the first worker to create its claim file runs it (a shared queue without a server)
            os.close(os.open(lines.parent / f"{lines.name}.claim{k}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        try:
            r = train_run(p, arm, seed, steps, data, device)
        except Exception as e:  # one broken arm must not lose the others: the record says what broke
            r = {"arm": arm, "seed": seed, "error": f"{type(e).__name__}: {e}"}
        with lines.open("a") as f:
            f.write(json.dumps(r) + "\n")
        print(f"  {arm:16s} seed {seed}: " + (f"val {r['val']:.4f} nats/byte" if "val" in r else
              r.get("error", "diverged")) + f"  ({r.get('seconds', 0)} s)", flush=True)


def summary(runs: list[dict], p: Preset) -> dict:
    """Per arm: mean and sd of each measurement over its seeds."""
    out = {}
    for arm in arms(p):
        rs = [r for r in runs if r["arm"] == arm and "error" not in r]
        if not rs:
            continue
        keys = [k for k, v in rs[0].items() if isinstance(v, float) and k not in ("seconds",)]
        out[arm] = {"seeds": [r["seed"] for r in rs], "diverged": sum(r["diverged"] for r in rs),
                    "params": rs[0]["params"]}
        for k in keys:
            vals = [r[k] for r in rs if k in r and math.isfinite(r[k])]
            if vals:
                out[arm][k] = {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                               "values": vals}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: gpu with CUDA, else cpu")
    ap.add_argument("--out", type=Path, default=None, help="record path (default bench/at_scale/<preset>.json; "
                    "the tiny preset defaults to build/at_scale/tiny.json)")
    ap.add_argument("--steps", type=int, default=0, help="skip calibration and train every arm this many steps")
    ap.add_argument("--budget", type=float, default=0, help="override the preset's time budget (seconds)")
    ap.add_argument("--arms", default="", help="comma-separated subset of arms (default: all)")
    ap.add_argument("--workers", type=int, default=0, help="override the preset's number of worker processes")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 autocast on a CPU too (to check that path without a GPU)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)  # i/n:steps:path, set by the parent
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    p = PRESETS[a.preset or ("gpu" if device == "cuda" else "cpu")]
    if p.bf16 and device != "cuda":
        p = replace(p, bf16=False)  # the gpu preset forced onto a CPU: float32
    if a.budget:
        p = replace(p, budget_s=a.budget)
    if a.bf16:
        p = replace(p, bf16=True)
    if a.workers:
        p = replace(p, workers=a.workers)
    selected = a.arms.split(",") if a.arms else list(arms(p))
    unknown = set(selected) - set(arms(p))
    if unknown:
        ap.error(f"unknown arm(s) {sorted(unknown)}; choose from {', '.join(arms(p))}")
    todo = [r for r in plan(p) if r[0] in selected]
    if a.worker:
        ij, steps, path = a.worker.split(":", 2)
        i, n = map(int, ij.split("/"))
        worker(p, todo, int(steps), device, Path(path), i)
        return 0
    out = a.out or ((CACHE if p.name == "tiny" else RECORDS) / f"{p.name}.json")
    ident, _ = load_data(p, "cpu")
    # The run queue (finished runs, claim files, timings) belongs to this invocation: two runs at once (two test
    # workers, or a reader's second terminal) would otherwise take each other's runs and delete each other's files.
    CACHE.mkdir(parents=True, exist_ok=True)
    queue = Path(tempfile.mkdtemp(prefix=f"{p.name}-queue-", dir=CACHE))
    lines = queue / "runs.jsonl"
    lines.touch()
    t_start, per_step, steps = time.time(), None, a.steps or p.fixed_steps
    print(f"at-scale {p.name} on {device}: {len(todo)} runs ({p.n_layers} layers, d_model {p.d_model}, "
          f"context {p.context}, batch {p.batch}), {p.workers} worker(s), budget {p.budget_s:.0f} s", flush=True)
    if p.workers == 1:
        _, data = load_data(p, device)
        if not steps:
            per_step, eval_s = time_steps(p, data, device)
            steps = steps_for(p, len(todo), per_step, p.budget_s - (time.time() - t_start), eval_s)
        print(f"  {steps} steps per run", flush=True)
        worker(p, todo, steps, device, lines, data=data)
    else:
        cmd = [sys.executable, "-m", "proofs.at_scale", "--preset", p.name, "--budget", str(p.budget_s),
               "--workers", str(p.workers)] + ["--bf16"] * a.bf16
        procs = [subprocess.Popen(cmd + ["--arms", ",".join(selected), "--worker", f"{i}/{p.workers}:{steps}:{lines}"],
                                  cwd=E.ROOT) for i in range(p.workers)]
        if not steps:
            cal = [lines.parent / f"{lines.name}.cal{i}" for i in range(p.workers)]
            while not all(c.is_file() for c in cal):
                if any(pr.poll() for pr in procs):
                    raise SystemExit("a worker failed while timing the baseline (its error is above)")
                time.sleep(0.2)
            timed = [json.loads(c.read_text()) for c in cal]  # while all workers ran at once
            per_step, eval_s = (statistics.fmean(x[i] for x in timed) for i in (0, 1))
            steps = steps_for(p, len(todo), per_step, p.budget_s - (time.time() - t_start), eval_s)
            (lines.parent / f"{lines.name}.steps").write_text(str(steps))
            print(f"  {steps} steps per run ({per_step * 1e3:.1f} ms per step with {p.workers} workers at once)", flush=True)
        if any(pr.wait() for pr in procs):
            print("a worker failed; the record keeps the runs that finished", file=sys.stderr)
    runs = [json.loads(s) for s in lines.read_text().splitlines() if s.strip()]
    runs.sort(key=lambda r: (list(arms(p)).index(r["arm"]), r["seed"]))
    record = {
        "preset": asdict(p), "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "device_kind": device, "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "corpus": ident, "steps": steps,
        "tokens_per_run": steps * p.batch * p.context, "calibration_ms_per_step": per_step and round(per_step * 1e3, 2),
        "wall_seconds": round(time.time() - t_start, 1), "date": dt.date.today().isoformat(),
        "fingerprint": E.fingerprint(Path(__file__)), "training_fingerprint": training_fingerprint(), "base_config": asdict(base_config(p)),
        "arms": {k: {**asdict(v), "switches": v.switches} for k, v in arms(p).items()},
        "runs": runs, "summary": summary(runs, p),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=float) + "\n")
    shutil.rmtree(queue, ignore_errors=True)
    print(f"wrote {out} ({len(runs)} runs, {record['wall_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
