"""A recorded run's model, config and tokenizer, read back from its checkpoint (for ``python -m
lm_ablate.export`` and ``python -m lm_ablate.evaluate``, and notebooks): the checkpoint holds the resolved
config the model was built from, so nothing is composed again and a later change of conf/ changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lm_ablate import checkpoint as ckpt
from lm_ablate.errors import ConfigError, bad


@dataclass
class Run:
    model: Any  # TransformerLM, fp32, eval mode, on the CPU
    cfg: DictConfig  # the resolved config the run trained with
    step: int  # the checkpoint's step
    path: Path  # the checkpoint file


def checkpoint_path(run_dir: Path, step: int | None, key: str = "RUN_DIR") -> Path:
    """The run's checkpoint at ``step`` (None: its newest); one line when there is none."""
    found = ckpt.list_checkpoints(run_dir)
    if not run_dir.is_dir():
        raise bad(key, str(run_dir), "no such run directory")
    if not found:
        raise bad(key, str(run_dir), f"no checkpoint in {ckpt.DIR_NAME}/ (a run writes one at its end)")
    if step is None:
        return found[-1]
    by_step = {int(p.stem.split("_")[1]): p for p in found}
    if step not in by_step:
        kept = ", ".join(map(str, sorted(by_step)))
        raise bad("--step", step, f"the run kept checkpoints at steps {kept} (train.keep_checkpoints)")
    return by_step[step]


def config_of(saved: dict) -> DictConfig:
    """The recorded config as a typed node of the current schema (keys a record lacks take their defaults)."""
    from lm_ablate.schema import Config

    base = OmegaConf.structured(Config)
    OmegaConf.set_struct(base, False)  # a record may hold keys of a newer or older schema: they do not matter here
    cfg = OmegaConf.merge(base, saved)
    from lm_ablate.options import settle

    settle(cfg)  # a key the record lacks and its options do not read: null, as in a run composed today
    return cfg  # type: ignore[return-value]


def load_run(run_dir: str | Path, step: int | None = None) -> Run:
    """The model of ``run_dir``'s checkpoint at ``step`` (its newest when None)."""
    import torch

    from lm_ablate.model import TransformerLM

    run_dir = Path(run_dir).expanduser()
    path = checkpoint_path(run_dir, step)
    state = ckpt.load(path)
    cfg = config_of(state["config"])
    if "dcp" in state:  # a folder checkpoint of an fsdp / hsdp run: its shards, read whole by DCP
        weights = dcp_model_state(state["dcp"], cfg)
    else:
        weights = state["model"]
    model = TransformerLM(cfg, int(weights["embed.weight"].shape[0]))
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise ConfigError(
            f"RUN_DIR={str(run_dir)!r} is invalid: its checkpoint does not fit its config ({first})"
        ) from None
    model.to(torch.float32).eval()
    return Run(model, cfg, int(state["step"]), path)


def dcp_model_state(folder: str, cfg: DictConfig) -> dict[str, Any]:
    """The whole model state of a DCP folder checkpoint (lm_ablate/dcp.py), loaded in this one process."""
    import torch.distributed.checkpoint as dcp

    from lm_ablate.model import TransformerLM

    template = TransformerLM(cfg, int(cfg.model.vocab_size)).state_dict()
    try:
        dcp.load({"model": template}, checkpoint_id=str(folder), no_dist=True)
    except Exception as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)[:200]
        raise ConfigError(f"RUN_DIR checkpoint {folder!r} is invalid: DCP could not read its model ({first})") from None
    return template


def run_tokenizer(cfg: DictConfig) -> Any:
    """The tokenizer the run trained with (encode(text), decode(ids), vocab_size), without tokenizing its corpus:
    bytes; the cached BPE (trained again, identically, if the cache was cleared); the pretrained one; for
    data=tokens the one named by data.tokenizer_path, else an ids-only stand-in that cannot encode text."""
    from lm_ablate.data.common import absolute
    from lm_ablate.data.pretokenized import IdsTokenizer
    from lm_ablate.data.tokenizers import load_pretrained
    from lm_ablate.registry import DATASETS, TOKENIZERS

    data = cfg.data
    if data.name == "tokens":
        return load_pretrained(data.tokenizer_path) if data.tokenizer_path else IdsTokenizer(data.vocab_size)
    return TOKENIZERS.get(data.tokenizer)(data, DATASETS.build(data), absolute(data.cache_dir))
