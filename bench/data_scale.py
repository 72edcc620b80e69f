"""Tokenizing a real-size corpus: wall time, MB/s and peak memory of ``load_data`` against the code it replaced
and a nanoGPT-style reference, all measured in the same run.

    python bench/data_scale.py [--sizes 200 1000] [--tokenizers byte bpe pretrained] [--no-old] [--no-ref]
                               [--variants] [--quick] [--workdir /tmp/lm_ablate_data_scale]

The corpora are the bundled Shakespeare repeated to N MB (``<workdir>/corpus_<N>mb.txt``, one document per
paragraph: ``data=hf data.path=...``), generated on first use and never committed. Each measurement runs in a
fresh subprocess with a fresh cache:

* ``new``: ``lm_ablate.data.load_data`` (streamed, chunked, ``data.num_proc`` = 2 processes where they pay);
* ``old``: ``load_data`` of commit 9bcf2e2 (``git show 9bcf2e2:lm_ablate/data.py``: whole corpus in Python
  strings, one process) for byte and bpe (it had no pretrained tokenizer);
* ``ref``: nanoGPT's prepare.py pattern: ``datasets`` text builder, ``map(num_proc=2)`` (batched, 1,000
  documents a call: faster than prepare.py's one at a time), ids + EOS per document, then the 1,024 shards
  written into one ``np.memmap`` by offsets. Same tokenizer file as
  ``new`` (the BPE ``new`` trained, so ``ref`` leaves out BPE training; ``new`` includes it);
* ``hit``: ``load_data`` again in a fresh process: the data set-up time of a run that finds the cache;
* ``--variants``: the choices the code makes, measured: the byte tokenizer in 2 worker processes (the code
  keeps it inline) and the BPE / pretrained tokenizers inline (one process; Rust threads in ``encode_batch``);
  ``--compare MB --rounds N`` measures only that, both ways interleaved (wall and CPU seconds).

``pretrained`` is a 16,384-symbol byte-level BPE saved as tokenizer.json + tokenizer_config.json (the hub
layout; no network here), trained once on the bundled corpus. BPE: ``data.vocab_size=4096``, trained on the
whole training split (``data.tokenizer_sample`` unset, the default).

Memory: peak of the summed RSS of the subprocess and all its descendants (sampled every 0.1 s: worker
processes included; shared library pages counted once per process, so this overstates), and the largest
single process's ``ru_maxrss`` (``os.wait4``). Targets (issue 11): tree peak <= 2 GB at 200 MB and 1 GB for
every tokenizer; 1 GB within 1.2x of 200 MB; ``new`` at least as fast as ``old`` at 200 MB; ``hit`` < 2 s.
The machine may be shared: the load average is printed next to every row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import REPO, header, loadavg, table

OLD_COMMIT = "9bcf2e2"  # the last commit with the single-string lm_ablate/data.py
GB = 1 << 30


# --------------------------------------------------------------------------------------------- corpora


def corpus(workdir: Path, mb: float) -> Path:
    """Shakespeare's works joined by blank lines, repeated to ``mb`` MB (generated once)."""
    path = workdir / f"corpus_{mb:g}mb.txt"
    if path.exists():
        return path
    from lm_ablate.data import shakespeare_works

    works = shakespeare_works()
    block = ("\n\n".join(works[w] for w in sorted(works)) + "\n\n").encode()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        written = 0
        while written < mb * 1e6:
            piece = block[: int(mb * 1e6 - written)] if mb * 1e6 - written < len(block) else block
            f.write(piece)
            written += len(piece)
    tmp.replace(path)
    return path


def pretrained_tokenizer(workdir: Path) -> Path:
    """A 16k byte-level BPE in the hub's file layout, standing in for GPT-2 / Llama (no network here)."""
    folder = workdir / "pretrained_16k"
    if (folder / "tokenizer.json").exists():
        return folder
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from lm_ablate.data import shakespeare_works

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=16384,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(shakespeare_works().values()), trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)
    return folder


# ---------------------------------------------------------------------------------------- child side


def child(spec: dict) -> dict:
    """One measurement, in this (fresh) process; returns what the parent prints."""
    from lm_ablate.config import DataConfig

    kw = dict(name="hf", path=spec["corpus"], tokenizer=spec["tokenizer"], cache_dir=spec["cache"], num_proc=2)
    if spec["tokenizer"] == "bpe":
        kw["vocab_size"] = 4096
    if spec["tokenizer"] == "pretrained":
        kw["tokenizer_path"] = spec["tok_path"]
    if spec["kind"] == "old":
        import importlib.util

        kw.pop("num_proc")
        mod_spec = importlib.util.spec_from_file_location("old_data", spec["old_module"])
        old = sys.modules["old_data"] = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(old)
        start = time.perf_counter()
        d = old.load_data(DataConfig(**kw))
    elif spec["kind"] == "ref":
        return nanogpt_reference(spec)
    else:
        import lm_ablate.data.cache as C
        from lm_ablate.data import load_data

        if spec.get("force") == "pool":  # the byte tokenizer in worker processes, which the code does not choose
            import lm_ablate.data.tokenizers as T

            T.ByteTokenizer.parallel = True
            C.POOL_MIN_BYTES = 0
        elif spec.get("force") == "inline":
            C.POOL_MIN_BYTES = 1 << 62
        start = time.perf_counter()
        d = load_data(DataConfig(**kw))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": len(d.train) + len(d.val), "vocab": d.vocab_size}


def nanogpt_reference(spec: dict) -> dict:
    """nanoGPT's data/openwebtext/prepare.py pattern on our corpus and tokenizer (no split: all one file)."""
    import datasets
    import numpy as np

    datasets.disable_progress_bars()
    start = time.perf_counter()
    if spec["tokenizer"] == "byte":
        eos, dtype = [10, 10], np.uint16

        def process(batch: dict) -> dict:
            ids = [list(text.encode("utf-8")) + eos for text in batch["text"]]
            return {"ids": ids, "len": [len(x) for x in ids]}

    else:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(spec["tok_file"])
        eos = [tok.token_to_id("<|endoftext|>")]
        dtype = np.uint16 if tok.get_vocab_size() <= 1 << 16 else np.uint32

        def process(batch: dict) -> dict:
            ids = [e.ids + eos for e in tok.encode_batch_fast(batch["text"], add_special_tokens=False)]
            return {"ids": ids, "len": [len(x) for x in ids]}

    cache = str(Path(spec["cache"]) / "hf")
    ds = datasets.load_dataset("text", data_files={"train": spec["corpus"]}, sample_by="paragraph", cache_dir=cache)
    tokenized = ds["train"].map(process, remove_columns=["text"], batched=True, num_proc=2)
    total = int(np.sum(tokenized["len"], dtype=np.uint64))
    arr = np.memmap(Path(spec["cache"]) / "train.bin", dtype=dtype, mode="w+", shape=(total,))
    idx = 0
    for i in range(1024):
        batch = tokenized.shard(num_shards=1024, index=i, contiguous=True).with_format("numpy")
        part = np.concatenate(batch["ids"])
        arr[idx : idx + len(part)] = part
        idx += len(part)
    arr.flush()
    return {"seconds": time.perf_counter() - start, "tokens": total, "vocab": None}


# --------------------------------------------------------------------------------------- parent side


def tree_rss(root: int) -> int:
    """Summed resident bytes of ``root`` and its descendants, from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += parents.get(pid, [])
        with contextlib.suppress(OSError, IndexError, ValueError):  # a process that just ended
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def measure(spec: dict) -> dict:
    """Run ``child(spec)`` in a subprocess; its result plus peak tree RSS and the largest process's maxrss."""
    load_start = os.getloadavg()[0]
    env = {**os.environ, "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(spec)], cwd=REPO, stdout=subprocess.PIPE, text=True, env=env
    )
    peak = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        raise SystemExit(f"child failed ({proc.returncode}): {spec}")
    result = json.loads(out.strip().splitlines()[-1])
    maxrss = usage.ru_maxrss * 1024  # kB on Linux; the largest of the child and its waited-for descendants
    cpu = usage.ru_utime + usage.ru_stime  # the child and its waited-for descendants (pool workers), imports included
    load = f"{load_start:.1f}-{os.getloadavg()[0]:.1f}"
    result.update(tree_peak=max(peak, maxrss), max_proc=maxrss, cpu=cpu, load=load)
    return result


class Runner:
    """Measures with a fresh cache per measurement (the ``hit`` rows reuse the ``new`` row's cache)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.old_module = workdir / "old_data.py"
        if not self.old_module.exists():
            src = subprocess.run(
                ["git", "show", f"{OLD_COMMIT}:lm_ablate/data.py"], cwd=REPO, capture_output=True, text=True
            )
            if src.returncode == 0:
                self.old_module.write_text(src.stdout)
        self.rows: list[list] = []
        self.results: dict[tuple, dict] = {}

    def run(self, mb: float, tokenizer: str, kind: str, force: str | None = None) -> dict | None:
        path = corpus(self.workdir, mb)
        cache = self.workdir / f"cache_{mb:g}_{tokenizer}_{kind}_{force}"
        if kind != "hit":
            shutil.rmtree(cache, ignore_errors=True)
        else:
            cache = self.workdir / f"cache_{mb:g}_{tokenizer}_new_None"
        spec = {
            "kind": "new" if kind == "hit" else kind,
            "tokenizer": tokenizer,
            "corpus": str(path),
            "cache": str(cache),
        }
        spec.update(force=force, old_module=str(self.old_module))
        if tokenizer == "pretrained":
            spec["tok_path"] = str(pretrained_tokenizer(self.workdir))
            spec["tok_file"] = str(pretrained_tokenizer(self.workdir) / "tokenizer.json")
        if kind == "ref" and tokenizer == "bpe":  # the BPE the new path trained on this corpus
            files = sorted((self.workdir / f"cache_{mb:g}_bpe_new_None" / "tokenizers").glob("*.json"))
            if not files:
                return None
            spec["tok_file"] = str(files[0])
        if kind == "old" and not self.old_module.exists():
            return None
        r = measure(spec)
        size = path.stat().st_size
        name = kind + (f" ({force})" if force else "")
        self.results[(mb, tokenizer, name)] = r
        self.rows.append(
            [
                f"{mb:g} MB",
                tokenizer,
                name,
                f"{r['seconds']:.2f}",
                f"{size / r['seconds'] / 1e6:.1f}" if kind != "hit" else "-",
                f"{r['tree_peak'] / GB:.2f}",
                f"{r['max_proc'] / GB:.2f}",
                f"{r['tokens'] / 1e6:.1f}",
                r["load"],
            ]
        )
        print("   " + "  ".join(str(c) for c in self.rows[-1]), flush=True)
        if kind not in ("hit", "old"):
            shutil.rmtree(cache / "hf", ignore_errors=True)  # the reference's Arrow copies: GBs
        return r


def compare(r: Runner, mb: float, tokenizers: list[str], rounds: int) -> None:
    """The pool-or-inline choice, measured: both ways interleaved (A B, B A, ...), medians and CPU seconds."""
    import statistics

    lines = []
    for tok in tokenizers:
        other = "pool" if tok == "byte" else "inline"
        runs: dict[str, list[dict]] = {"choice": [], other: []}
        for i in range(rounds):
            for force in (None, other) if i % 2 == 0 else (other, None):
                runs["choice" if force is None else other].append(r.run(mb, tok, "new", force=force))
        wall = {k: statistics.median(x["seconds"] for x in v) for k, v in runs.items()}
        cpu = {k: statistics.median(x["cpu"] for x in v) for k, v in runs.items()}
        pairs = [o["seconds"] / c["seconds"] for c, o in zip(runs["choice"], runs[other])]
        lines.append(
            f"{tok}: code's choice {wall['choice']:.2f} s ({cpu['choice']:.1f} CPU s), {other} {wall[other]:.2f} s "
            f"({cpu[other]:.1f} CPU s), {other}/choice per round {', '.join(f'{x:.2f}' for x in pairs)}"
        )
    print()
    print(
        table(
            ["corpus", "tokenizer", "path", "wall s", "MB/s", "tree RSS GB", "max proc GB", "tokens M", "load"], r.rows
        )
    )
    print("RESULT " + "; ".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--sizes", type=float, nargs="+", default=[200.0])
    p.add_argument("--tokenizers", nargs="+", default=["byte", "bpe", "pretrained"])
    p.add_argument("--no-old", action="store_true", help="skip the former single-string code")
    p.add_argument("--no-ref", action="store_true", help="skip the nanoGPT-style reference")
    p.add_argument("--variants", action="store_true", help="also byte in workers, pretrained inline")
    p.add_argument(
        "--compare",
        type=float,
        metavar="MB",
        help="only: the code's choice against the other one (workers or inline) for each tokenizer, interleaved",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of --compare")
    p.add_argument("--quick", action="store_true", help="a 5 MB smoke test; its numbers mean nothing")
    p.add_argument("--workdir", default="/tmp/lm_ablate_data_scale")
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = [5.0] if a.quick else a.sizes
    header(f"data_scale: load_data on {', '.join(f'{s:g} MB' for s in sizes)} of text ({', '.join(a.tokenizers)})")
    print(
        "   columns: wall s (data set-up, excl. imports), MB/s of text, peak RSS: process tree, largest process; tokens, load"
    )
    r = Runner(workdir)
    if a.compare:
        compare(r, a.compare, a.tokenizers, a.rounds)
        return
    for mb in sizes:
        for tok in a.tokenizers:
            r.run(mb, tok, "new")
            r.run(mb, tok, "hit")
            if not a.no_old and tok != "pretrained":
                r.run(mb, tok, "old")
            if not a.no_ref:
                r.run(mb, tok, "ref")
            if a.variants:
                r.run(mb, tok, "new", force="pool" if tok == "byte" else "inline")
    print()
    print(
        table(
            ["corpus", "tokenizer", "path", "wall s", "MB/s", "tree RSS GB", "max proc GB", "tokens M", "load"], r.rows
        )
    )
    print(f"   load average at end: {loadavg()}")
    parts = []
    for mb in sizes:
        for tok in a.tokenizers:
            new = r.results.get((mb, tok, "new"))
            if new is None:
                continue
            text = f"{mb:g}MB {tok}: new {new['tree_peak'] / GB:.2f} GB"
            for other in ("old", "ref"):
                o = r.results.get((mb, tok, other))
                if o:
                    text += f", {o['seconds'] / new['seconds']:.2f}x faster than {other} ({o['tree_peak'] / GB:.2f} GB)"
            hit = r.results.get((mb, tok, "hit"))
            if hit:
                text += f", hit {hit['seconds']:.2f} s"
            parts.append(text)
    if len(sizes) > 1:
        for tok in a.tokenizers:
            lo, hi = r.results.get((sizes[0], tok, "new")), r.results.get((sizes[-1], tok, "new"))
            if lo and hi:
                parts.append(f"{tok} RSS {sizes[-1]:g}MB / {sizes[0]:g}MB = {hi['tree_peak'] / lo['tree_peak']:.2f}x")
    print("RESULT " + "; ".join(parts))


if __name__ == "__main__":
    main()
