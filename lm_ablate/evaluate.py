"""``python -m lm_ablate.evaluate RUN_DIR --tasks hellaswag,arc_easy [--include DIR] [--limit N]``: a run's
checkpoint through EleutherAI's lm-evaluation-harness (``pip install -e ".[eval]"``), results written beside
the run record as ``lm_eval.json`` (lm_ablate/metrics.py ``LM_EVAL_FILE``), where analysis/ reads them.

lm-eval drives an :class:`AblateLM`, an ``lm_eval.api.model.LM`` over the run's own model and tokenizer, rather
than its ``HFLM`` over an exported folder, because
  * every run can be evaluated, also the configs no Hugging Face family computes (deepnorm, ReZero, μP, T5
    bias, sinusoidal positions, ...: the arms an ablation is about), and byte-level runs as they are;
  * its log-likelihoods are the in-loop scorer's (lm_ablate/eval/scorer.py ``loglikelihoods``: batched,
    padded, bounded in memory), so in-loop and lm-eval numbers come from one computation;
  * it needs no export step and none of HFLM's extra dependencies (accelerate).
``python -m lm_ablate.export`` + ``lm_eval --model hf --model_args pretrained=HF_DIR`` remains the way for an
exported folder.

Requests (lm-eval's ``LM`` interface): ``loglikelihood`` of (context, continuation) pairs, the pair tokenized
as the scorer does (lm-eval's ``_encode_pair``; an empty context becomes the run's document separator: EOS, or
``\\n`` for bytes, the exported tokenizer's BOS, unless the continuation starts with it, as lm-eval does);
``loglikelihood_rolling`` of whole texts in disjoint windows of ``model.context`` tokens, each after the
separator or its window's predecessor (lm-eval's ``get_rolling_token_windows``); ``generate_until``:
greedy decoding, one token at a time over the last ``model.context`` tokens, until a stop string or
``max_gen_toks``.

``lm_eval.json``: ``{"step": N, "checkpoint": ..., "lm_eval_version": ..., "num_fewshot": ..., "limit": ...,
"tasks": {task: {metric: value}}, "results": lm-eval's own results}``; metric names drop lm-eval's ``,none``
filter suffix (another filter stays as ``metric,filter``); a later call adds its tasks to the file and replaces
those it evaluates again.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from lm_ablate import metrics as M
from lm_ablate.errors import ConfigError, bad
from lm_ablate.eval.scorer import encode_pair, fit, loglikelihoods


def require_lm_eval() -> Any:
    try:
        import lm_eval
        import lm_eval.api.model
    except ImportError:
        raise ConfigError(
            'lm-eval is not installed: python -m lm_ablate.evaluate runs lm-evaluation-harness; pip install -e ".[eval]"'
        ) from None
    return lm_eval


def make_lm(model: torch.nn.Module, tokenizer: Any, context_len: int, batch_tokens: int = 4096) -> Any:
    """An ``lm_eval.api.model.LM`` over ``model`` (module docstring)."""
    lm_eval = require_lm_eval()
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    from lm_ablate.data.tokenizers import SEP

    eos = getattr(tokenizer, "eos_id", None)
    prefix = int(eos) if eos is not None else int(tokenizer.encode(SEP)[-1])

    def encode(text: str) -> list[int]:
        return [int(i) for i in tokenizer.encode(text)]

    class AblateLM(lm_eval.api.model.LM):
        def _pairs(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
            fitted = [fit(c or [prefix], t, context_len, "lm-eval request") for c, t in pairs]
            return loglikelihoods(model, fitted, batch_tokens)

        def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
            pairs = []
            for request in requests:
                context, continuation = request.args
                if context:
                    pairs.append(encode_pair(encode, context, continuation))
                else:  # lm-eval's LM.loglikelihood: the prefix, unless the continuation starts with it
                    ids = encode(continuation)
                    pairs.append(([prefix], ids) if ids[0] != prefix else (ids[:1], ids[1:]))
            return self._pairs(pairs)

        def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
            out = []
            for request in requests:
                windows = [
                    make_disjoint_window(w)
                    for w in get_rolling_token_windows(encode(request.args[0]), prefix, context_len, 1)
                ]
                out.append(sum(ll for ll, _ in self._pairs([(list(c), list(t)) for c, t in windows])))
            return out

        @torch.no_grad()
        def generate_until(self, requests: list[Any]) -> list[str]:
            out = []
            model.eval()
            for request in requests:
                context, kwargs = request.args
                until = kwargs.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                ids = encode(context) or [prefix]
                new: list[int] = []
                text = ""
                for _ in range(int(kwargs.get("max_gen_toks", 256))):
                    logits = model(torch.tensor([(ids + new)[-context_len:]]))
                    new.append(int(logits[0, -1].argmax()))
                    text = tokenizer.decode(new)
                    if any(u in text for u in until):
                        break
                for u in until:
                    text = text.split(u)[0]
                out.append(text)
            return out

    return AblateLM()


def metric_table(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """lm-eval's ``results`` as {task: {metric: value}}: numbers only, ``,none`` dropped."""
    out: dict[str, dict[str, float]] = {}
    for task, values in results.get("results", {}).items():
        row = {}
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and "," in key:
                name, _, filt = key.partition(",")
                row[name if filt == "none" else key] = float(value)
        out[task] = row
    return out


def _json_safe(value: Any) -> Any:
    try:
        return json.loads(json.dumps(M.to_json(value), default=str))
    except (TypeError, ValueError):
        return str(value)


def evaluate(
    run_dir: str | Path,
    tasks: list[str],
    include: list[str] | None = None,
    limit: float | None = None,
    num_fewshot: int | None = None,
    step: int | None = None,
    batch_tokens: int = 4096,
    bootstrap_iters: int = 0,
) -> dict[str, Any]:
    """Run lm-eval's ``simple_evaluate`` on ``run_dir``'s model over ``tasks`` (names lm-eval knows, or defined
    by the YAML files under ``include``) and write ``run_dir/lm_eval.json``; returns what was written and, under
    ``"evaluated"``, the names lm-eval scored in this call (a group, then its subtasks; a tag's tasks) in lm-eval's
    order: what the command prints, each name once."""
    from lm_ablate.eval.run import checkpoint_path, load_run, run_tokenizer
    from lm_ablate.tracking import atomic_write_text

    run_dir = Path(run_dir).expanduser()
    checkpoint_path(run_dir, step)  # the run and its checkpoint first: cheap, before lm-eval is imported
    require_lm_eval()
    if not tasks:
        raise bad("--tasks", "", "name at least one task (hellaswag,arc_easy; or one defined under --include)")
    for path in include or []:
        if not Path(path).exists():
            raise bad("--include", path, "no such file or folder of lm-eval task YAMLs")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=[str(Path(p).absolute()) for p in include] if include else None)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        raise bad("--tasks", ",".join(tasks), f"lm-eval knows no task {unknown[0]!r} (lm_eval ls tasks lists them; "
                  "a task of your own: a YAML under --include)")  # fmt: skip
    run = load_run(run_dir, step)
    tokenizer = run_tokenizer(run.cfg)
    from lm_ablate.data.pretokenized import IdsTokenizer

    if isinstance(tokenizer, IdsTokenizer):
        raise bad("RUN_DIR", str(run_dir), "data=tokens without data.tokenizer_path: no tokenizer to encode task text")
    lm = make_lm(run.model, tokenizer, run.cfg.model.context, batch_tokens)
    try:
        results = simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                  num_fewshot=num_fewshot, bootstrap_iters=bootstrap_iters, log_samples=False)  # fmt: skip
    except ConfigError:
        raise
    except Exception as e:  # a task's data cannot be loaded (offline hub dataset), a bad task YAML, ...
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise bad("--tasks", ",".join(tasks), f"lm-eval failed [{type(e).__name__}: {first[:200]}]") from None
    path = run_dir / M.LM_EVAL_FILE
    previous = json.loads(path.read_text()) if path.exists() else {}
    import lm_eval

    record = {
        "step": run.step,
        "checkpoint": str(run.path),
        "lm_eval_version": getattr(lm_eval, "__version__", None),
        "num_fewshot": num_fewshot,
        "limit": limit,
        "tasks": {**previous.get("tasks", {}), **metric_table(results or {})},
        "results": {**previous.get("results", {}), **_json_safe((results or {}).get("results", {}))},
    }
    atomic_write_text(path, json.dumps(M.to_json(record), indent=1, sort_keys=True) + "\n")
    return {**record, "evaluated": list((results or {}).get("results", {}))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lm_ablate.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    parser.add_argument("--include", action="append", default=None, help="a folder or YAML of tasks of your own")
    parser.add_argument("--limit", type=float, default=None, help="examples per task (< 1: a fraction)")
    parser.add_argument("--num-fewshot", type=int, default=None)
    parser.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="tokens per forward pass")
    parser.add_argument("--bootstrap-iters", type=int, default=0, help="lm-eval's stderr bootstrap (0: none)")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    try:
        record = evaluate(args.run_dir, tasks, args.include, args.limit, args.num_fewshot, args.step,
                          args.batch_tokens, args.bootstrap_iters)  # fmt: skip
    except ConfigError as err:
        print(f"lm-ablate: error: {err}", file=sys.stderr)
        sys.exit(2)
    for name in record["evaluated"]:  # this call's tasks only, each once (not every name a task's prefixes)
        values = record["tasks"].get(name, {})
        shown = ", ".join(f"{k}={v:.4f}" for k, v in values.items() if math.isfinite(v))
        print(f"{name}: {shown}")
    print(f"-> {Path(args.run_dir) / M.LM_EVAL_FILE}")


if __name__ == "__main__":
    main()
