"""Every study in sweeps/ composes as Hydra will run it, and every arm of it validates and builds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lm_ablate.config import compose
from lm_ablate.model import TransformerLM
from lm_ablate.study import DEFAULT_STUDY, studies

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {
    "norm_2x2",
    "pre_vs_post_norm",
    "rmsnorm_vs_layernorm",
    "norm_placement",
    "position",
    "activation",
    "attention",
    "regularization",
    "lr_sensitivity",
    "parallel_vs_serial",
    "prepost_map",
    "optimizer",
    "lr_transfer",
    "ladder_activation",
    "ladder_arch",
    "ladder_optimizer",
    "lr_transfer_base",
    "ladder_arch_base",
    "ladder_activation_base",
    "ladder_optimizer_base",
    *("ffn_ratio", "heads", "aspect", "vocab", "weight_decay"),  # the hyperparameter half (issue 47)
}
# studies at a fixed non-embedding parameter count (shape=iso solves each arm's sizes)
ISO = {"ffn_ratio", "heads", "aspect", "vocab", "weight_decay"}
# studies whose claims are about a fixed regime (a high LR without warmup, the post-LN map over depth x LR): they
# keep their one setting (issue 23); every other study tunes the LR per arm and warms up
REGIME = {"norm_2x2", "pre_vs_post_norm", "prepost_map"}
# the μP ladders whose output multiplier is tuned per arm at rung 0 by a study of its own (its sweep: a_out x LR)
BASE_OF = {
    "ladder_arch": "ladder_arch_base",
    "ladder_activation": "ladder_activation_base",
    "ladder_optimizer": "ladder_optimizer_base",
}
# tuning steps: lr_transfer and the μP ladders take their best cells
NO_CLAIMS = {"lr_transfer_base", *BASE_OF.values()}
LOSS_METRICS = {"final_val_loss", "best_val_loss", "capped_val_loss", "val_loss_at_context", "extrapolation_gap"}
LR_KEYS = ("optim.lr", "lr_mult")
# the issues ask >= 3 seeds per point, except the maps over a grid: lr_transfer (widths x LRs x sp/mup),
# prepost_map (depth x LR x pre/post) and the ladders (rungs x LRs x 4 budgets: an LR grid per arm at every rung,
# each LR on 2 or 3 seeds), >= 2
LADDERS = {"ladder_activation", "ladder_arch", "ladder_optimizer"}
MIN_SEEDS = {"lr_transfer": 2, "prepost_map": 2, **dict.fromkeys(["lr_transfer_base", *BASE_OF.values(), *LADDERS], 2)}


def jobs(study: str) -> list[dict[str, str]]:
    """The jobs of a study's sweep file (key -> value as typed), in launch order: the basic sweeper's product of
    ``hydra.sweeper.params``, or the grids sweeper's union of products (hydra_plugins/lm_ablate_grids)."""
    from hydra_plugins.lm_ablate_grids.grids_sweeper import job_overrides

    sweeper = yaml.safe_load((ROOT / "sweeps" / f"{study}.yaml").read_text())["hydra"]["sweeper"]
    return [
        dict(line.split("=", 1) for line in job)
        for job in job_overrides(sweeper.get("params"), sweeper.get("grids"), [])
    ]


def params(study: str) -> dict[str, list[str]]:
    """Each swept key's values over all of a study's jobs, in order of first appearance."""
    values: dict[str, list[str]] = {}
    for job in jobs(study):
        for key, value in job.items():
            if value not in values.setdefault(key, []):
                values[key].append(value)
    return values


def test_all_studies_exist():
    assert set(studies()) >= REQUIRED and DEFAULT_STUDY in studies()


@pytest.mark.parametrize("study", sorted(REQUIRED))
def test_study_has_three_seeds_and_its_own_experiment(study):
    p = params(study)
    assert len(p["seed"]) >= MIN_SEEDS.get(study, 3)
    experiment = yaml.safe_load((ROOT / "conf" / "experiment" / f"{study}.yaml").read_text())
    assert experiment["study"] == study


@pytest.mark.parametrize("study", sorted(REQUIRED - ISO))
def test_every_arm_builds(study):
    """Each value of each swept key, the others at their first value (the arms a sweep can produce)."""
    p = params(study)
    first = {k: v[0] for k, v in p.items()}
    seen = set()
    for key, values in p.items():
        for value in values:
            arm = {**first, key: value}
            overrides = tuple(f"{k}={v}" for k, v in arm.items())
            if overrides in seen:
                continue
            seen.add(overrides)
            cfg = compose([f"experiment={study}", *overrides, "model.d_model=32", "model.n_heads=4"])
            assert cfg.study == study
            model = TransformerLM(cfg, 64)
            assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("study", sorted(ISO))
def test_every_arm_of_an_iso_study_builds_at_its_target_parameter_count(study):
    """Each arm of a shape=iso study (each value of each swept key but the LR and the seed, the others at their
    first value) composes to a model whose non-embedding parameters, counted off the built model, are within the
    shape's tolerance of the target: the study holds N fixed while the shape changes."""
    p = params(study)
    first = {k: v[0] for k, v in p.items()}
    shapes = set()
    for key, values in p.items():
        if key in ("optim.lr", "seed"):  # the same shape at every LR and seed
            continue
        for value in values:
            cfg = compose([f"experiment={study}", *(f"{k}={v}" for k, v in {**first, key: value}.items())])
            assert cfg.study == study and cfg.shape.name == "iso"
            model = TransformerLM(cfg, 256)
            embedding = model.embed.weight.numel() + model.position.embedding_params
            n = sum(q.numel() for q in model.parameters()) - embedding
            assert abs(n / cfg.shape.target_params - 1) <= cfg.shape.tolerance, (key, value, n)
            block = sum(q.numel() for q in model.blocks[0].parameters())  # moves with d_ff and the attention width
            shapes.add((cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads, block))
    # the swept value changes the shape, except where it is not a size: tau/T, and the vocabulary (tied embeddings
    # keep N, so every vocabulary solves to one shape)
    assert (len(shapes) == 1) == (study in ("weight_decay", "vocab")), shapes


def experiment(study: str) -> dict:
    return yaml.safe_load((ROOT / "conf" / "experiment" / f"{study}.yaml").read_text())


def lr_grid(study: str) -> list[float]:
    """The LRs a study's sweep gives its arms: optim.lr values, or lr_mult multipliers of the reference LR."""
    p = params(study)
    if "optim.lr" in p:
        return sorted(float(v) for v in p["optim.lr"])
    return sorted(float(v.lstrip("x")) for v in p.get("lr_mult", []))


def tuned_setting(study: str, values: dict[str, str]) -> str:
    """The keys a ladder tunes per cell (its ladder.tune) as a job or a report context spells them, a key the job
    leaves out at the experiment's value: "" without."""
    spec = experiment(study)
    keys = (spec.get("ladder") or {}).get("tune") or []
    value = lambda k: values[k] if k in values else spec[k.split(".")[0]][k.split(".")[1]]
    return ", ".join(f"{k}={float(value(k)):g}" for k in keys)


def mup_rung_grids(study: str) -> dict[str, dict[int, dict[float, list[str]]]]:
    """A μP ladder's LRs per arm (its activation/optim choice; with ladder.tune, each setting of those keys apart:
    "muon, model.mup_output_mult=16") and rung: rung -> LR -> the seeds that run it."""
    out: dict[str, dict[int, dict[float, list[str]]]] = {}
    for job in jobs(study):
        arm = job.get("activation") or job.get("optim") or job.get("arch")
        arm = ", ".join(filter(None, (arm, tuned_setting(study, job))))
        lrs = out.setdefault(arm, {}).setdefault(int(job["ladder.rung"]), {})
        lrs.setdefault(float(job["optim.lr"]), []).append(job["seed"])
    return out


def arm_lr_grids(study: str) -> dict[tuple, dict[float, set[str]]]:
    """Each arm's own LR grid (arm = a job's values of every key but the LR and the seed): LR -> its seeds."""
    grids: dict[tuple, dict[float, set[str]]] = {}
    for job in jobs(study):
        arm = tuple(sorted((k, v) for k, v in job.items() if k not in (*LR_KEYS, "seed")))
        lr = job.get("optim.lr") or job.get("lr_mult")
        if lr is not None:
            grids.setdefault(arm, {}).setdefault(float(lr.lstrip("x")), set()).add(job.get("seed", "0"))
    return grids


@pytest.mark.parametrize("study", sorted(REQUIRED - REGIME - NO_CLAIMS))
def test_quality_claims_are_decided_on_a_tuned_lr_with_warmup(study):
    """Issue 23: a claim about quality is decided at each arm's best LR, so the study sweeps an LR grid for every
    arm (at least two values, x2 or more apart) and does not pin optim.lr in the claim; every study warms up
    (the GPT-2 init / no warmup / lr 3e-3 setting put the baselines on the unigram plateau). A ladder trains each
    rung at its ladder's LR rule, and its claims are compute multipliers, not losses at one size."""
    spec = experiment(study)
    assert (spec.get("optim") or {}).get("warmup_steps", 0) > 0 or "optim.warmup_steps" in params(study)
    quality = [c for c in spec["claims"] if c["metric"] in LOSS_METRICS]
    for c in quality:
        assert "optim.lr" not in (c.get("context") or {}), c["id"]
    if quality:
        for arm, grid in arm_lr_grids(study).items():  # each arm's own grid (one shared grid, or one per arm)
            assert len(grid) >= 2 and max(grid) / min(grid) >= 2, (study, arm, sorted(grid))


# Studies run with hydra/sweeper=grids: each arm's centre, the best LR of the shared grid it replaced (the sweep
# file's comment gives the measurements), run with 3 seeds; half and twice it with seed 0.
GRID_CENTRES = {
    "norm_placement": ("norm.placement", {"pre": 6e-3, "post": 3e-3, "deepnorm": 3e-3, "none": 3e-3, "rezero": 2.4e-2}),
    "activation": ("activation", {"gelu": 6e-3, "swiglu": 6e-3, "geglu": 3e-3, "reglu": 3e-3, "relu": 3e-3}),
    "position": ("position", {"rope": 6e-3, "alibi": 6e-3, "learned": 3e-3, "sinusoidal": 1.5e-3}),
    "parallel_vs_serial": ("model.block", {"serial": 6e-3, "parallel": 6e-3}),
}
BOTH_SEEDED = {"activation": [("reglu", 6e-3), ("relu", 6e-3)]}


@pytest.mark.parametrize("study", sorted(GRID_CENTRES))
def test_a_grids_study_runs_each_arm_on_its_own_grid_with_three_seeds_at_its_centre(study):
    """Issue 23's time goal: arms whose best LRs differ, each on its own grid (its best LR of the shared grid with
    3 seeds, half and twice it with seed 0), 5 runs per arm (7 where an end is as close as the centre) instead
    of 3 per point of a shared grid."""
    key, centres = GRID_CENTRES[study]
    expected = {name: {c / 2: {"0"}, c: {"0", "1", "2"}, 2 * c: {"0"}} for name, c in centres.items()}
    for name, lr in BOTH_SEEDED.get(study, []):  # an end as close as the centre: 3 seeds there too
        expected[name][lr] = {"0", "1", "2"}
    grids = arm_lr_grids(study)
    assert {dict(arm)[key]: grid for arm, grid in grids.items()} == expected
    assert len(jobs(study)) == sum(len(seeds) for grid in expected.values() for seeds in grid.values())
    sweeper = yaml.safe_load((ROOT / "sweeps" / f"{study}.yaml").read_text())["defaults"]
    assert {"override hydra/sweeper": "grids"} in sweeper


def test_attention_keeps_three_seeds_at_the_lr_its_logit_claim_is_pinned_at():
    """attention: every arm on its own grid as above, and MHA with QK-norm (best at 3e-3) also with 3 seeds at
    6e-3, where qk_norm_bounds_attention_logits is decided in every attention (its context pins the LR)."""
    grids = {tuple(v for _, v in arm): grid for arm, grid in arm_lr_grids("attention").items()}
    around = lambda c: {c / 2: {"0"}, c: {"0", "1", "2"}, 2 * c: {"0"}}
    expected = {(a, v): around(6e-3) for a in ("mha", "gqa", "mqa") for v in ("base", "qk_norm")}
    expected["mha", "qk_norm"] = {**around(3e-3), 6e-3: {"0", "1", "2"}, 1.2e-2: {"0"}}
    assert grids == expected and len(jobs("attention")) == 33
    (logit,) = [c for c in experiment("attention")["claims"] if c["id"] == "qk_norm_bounds_attention_logits"]
    assert logit["context"] == {"optim.lr": 6e-3}


@pytest.mark.parametrize("study", sorted(LADDERS))
def test_a_ladders_committed_fits_read_its_declared_fit_window_and_show_every_budget_beside_it(study):
    """The fit window (docs/ladders.md): a ladder study's experiment declares which budgets its fits read (a subset
    of its budgets, without the smallest: its cells are still in the early transient), and the committed
    results/<study>/scaling_forms.csv fitted exactly those, with the chosen form refitted on every budget beside
    them (the window's check, chosen false). A study rerun or refitted with another window fails here."""
    import pandas as pd

    spec = experiment(study)["ladder"]
    window, budgets = [float(b) for b in spec["fit_budgets"]], [float(b) for b in spec["budgets"]]
    assert set(window) < set(budgets) and min(budgets) not in window, (window, budgets)
    forms = pd.read_csv(ROOT / "results" / study / "scaling_forms.csv", dtype={"fit_budgets": str})
    fitted = lambda rows: {tuple(float(b) for b in str(v).split()) for v in rows["fit_budgets"]}
    chosen = forms[forms["chosen"]]
    assert len(chosen) >= 2 and fitted(chosen) == {tuple(window)}, fitted(chosen)
    check = forms[forms["fit_budgets"].map(lambda v: tuple(float(b) for b in str(v).split())) == tuple(budgets)]
    assert set(check["form"]) == set(chosen["form"]) and not check["chosen"].any() and len(check) == len(chosen)


@pytest.mark.parametrize("study", sorted(LADDERS))
def test_ladders_fit_each_arm_and_rung_at_its_best_lr_over_several_budgets(study):
    """Issue 26: a ladder's claims are decided on each (arm, rung, budget) at its best LR: ladder.lr=grid over at
    least two LRs x2 apart, or under μP (ladder.lr=mup) a grid of 3+ LRs spanning 4x+ for every arm at every rung,
    every LR on seeds 0 and 1 (a further seed may run at a rung's best LRs only: the fits pick each cell on
    seed-adjusted means, analysis/compute/scaling.py). μP transfers the LR across widths at a fixed token count; a ladder grows the tokens
    with the width, and one LR tuned at rung 0 and transferred missed each arm's best at the wider rungs (Llama's
    best fell 2x, GPT-2's rose 2x or more, Muon's fell 4x: docs/ladders.md). With warm-up, and one WSD run per
    rung gives three or more token budgets."""
    spec = experiment(study)
    (ladder,) = [d["override /ladder"] for d in spec["defaults"] if isinstance(d, dict) and "override /ladder" in d]
    rule = spec["ladder"].get("lr") or yaml.safe_load((ROOT / "conf" / "ladder" / f"{ladder}.yaml").read_text())[
        "ladder"]["lr"]  # the study's LR rule, else its ladder's  # fmt: skip
    assert rule in ("grid", "mup") and spec["optim"]["warmup_steps"] > 0
    if rule == "grid":
        grid = lr_grid(study)
        assert len(grid) >= 2 and grid[-1] / grid[0] >= 2, (study, grid)
    else:
        assert ladder == "cpu_mup"  # a width-only ladder: μP's condition (conf/ladder/cpu_mup.yaml)
        rungs = yaml.safe_load((ROOT / "conf" / "ladder" / f"{ladder}.yaml").read_text())["ladder"]["rungs"]
        for arm, grid in mup_rung_grids(study).items():
            assert sorted(grid) == list(range(len(rungs))), (arm, sorted(grid))
            for rung, lrs in grid.items():
                assert len(lrs) >= 3 and max(lrs) / min(lrs) >= 4, (arm, rung, sorted(lrs))
                assert all({"0", "1"} <= set(seeds) for seeds in lrs.values()), (arm, rung, lrs)
    budgets = spec["ladder"]["budgets"]
    assert len(budgets) >= 3 and budgets == sorted(budgets) and spec["optim"]["schedule"] == "wsd"
    assert all(c["metric"] == "compute_multiplier" for c in spec["claims"])


@pytest.mark.parametrize("study", sorted(REGIME))
def test_regime_studies_keep_their_regime(study):
    """The regime studies are the only ones without warmup, and a claim there that the study's sweep does not
    already fix names its LR in its context."""
    spec = experiment(study)
    assert spec["optim"]["warmup_steps"] == 0
    if "optim.lr" in params(study):
        assert all("optim.lr" in (c.get("context") or {}) for c in spec["claims"]), study


def mup_ladders() -> list[str]:
    """The ladder studies whose LR rule is μP (ladder.lr=mup: their own, else their ladder's)."""
    out = []
    for study in sorted(LADDERS):
        spec = experiment(study)
        (ladder,) = [d["override /ladder"] for d in spec["defaults"] if isinstance(d, dict) and "override /ladder" in d]
        conf = yaml.safe_load((ROOT / "conf" / "ladder" / f"{ladder}.yaml").read_text())["ladder"]
        out += [study] if (spec["ladder"].get("lr") or conf["lr"]) == "mup" else []
    return out


@pytest.mark.parametrize("study", mup_ladders())
def test_a_per_rung_grid_ladder_brackets_each_arms_best_lr_at_every_rung(study):
    """Each (arm, rung, budget) cell of the gallery's run (results/<study>/lr_sweep.csv): the best LR (mean final
    loss over the seeds) lies inside the rung's grid, so no cell a fit reads is taken at a grid's edge (a budget is
    a decay branch of the rung's run: its LR is the run's, and the grid must bracket every budget's best). With
    ladder.tune, the setting of those keys whose best LR has the lowest loss is the one the fit reads: its LR is
    inside its grid (another setting's best may sit at its grid's edge, below the chosen one)."""
    import pandas as pd

    grids = mup_rung_grids(study)
    names = {arm.split(", ")[0] for arm in grids}
    table = pd.read_csv(ROOT / "results" / study / "lr_sweep.csv")
    seen, chosen = set(), {}
    for _, row in table.iterrows():
        values = dict(part.split("=", 1) for part in str(row["context"]).split(", "))
        (name,) = [v for v in values.values() if v in names]
        arm = ", ".join(filter(None, (name, tuned_setting(study, values))))
        rung, budget = int(values["ladder.rung"]), values["ladder.budget"]
        assert sorted(map(float, str(row["lr_grid"]).split())) == sorted(grids[arm][rung]), (arm, rung, budget)
        seen.add((arm, rung, budget))
        cell = chosen.setdefault((name, rung, budget), row)
        if row["final_val_loss_mean"] < cell["final_val_loss_mean"]:
            chosen[name, rung, budget] = row
    for cell, row in chosen.items():
        assert not row["best_at_edge"], (cell, row["context"], row["best_lr"], row["lr_grid"])
    budgets = ["null", *map(str, experiment(study)["ladder"]["budgets"][:-1])]  # the largest budget is the run's
    assert seen == {(arm, rung, b) for arm, grid in grids.items() for rung in grid for b in budgets}


def base_cells(study: str) -> dict[tuple, float]:
    """A tuning study's cells (sorted (key, value) pairs of its swept keys but the seed) -> mean final val loss,
    from the gallery's run (results/<study>/comparisons.csv)."""
    import pandas as pd

    cells: dict[tuple, float] = {}
    for _, row in pd.read_csv(ROOT / "results" / study / "comparisons.csv").iterrows():
        values = dict(part.split("=", 1) for part in str(row["context"]).split(", ") if "=" in part)
        values[row["axis"]] = str(row["arm"])
        cells[tuple(sorted(values.items()))] = float(row["final_val_loss_mean"])
    return cells


def test_lr_transfer_takes_the_base_sweeps_best_cell():
    """muTransfer's two halves: lr_transfer_base tunes muP's multipliers at the base width, lr_transfer sets the
    cell with the lowest mean final val loss there (results/lr_transfer_base/comparisons.csv, the gallery's run)
    and trains the same model and data long enough to leave the bigram level (>= 1000 steps; issue 23)."""
    base, transfer = experiment("lr_transfer_base"), experiment("lr_transfer")
    cells = base_cells("lr_transfer_base")
    tuned = {k: float(v) for k, v in min(cells, key=cells.__getitem__)}
    keys = {"model.mup_output_mult", "model.mup_attn_mult", "model.init_std"}
    assert set(tuned) == keys and len(cells) == 8  # every cell of the 2 x 2 x 2 sweep
    assert {k: float(transfer["model"][k.split(".")[1]]) for k in keys} == tuned
    widths = sorted(int(w) for w in params("lr_transfer")["model.d_model"])
    assert base["model"]["d_model"] == base["model"]["mup_base_width"] == transfer["model"]["mup_base_width"]
    assert transfer["model"]["mup_base_width"] == widths[0] and widths[-1] >= 8 * widths[0]
    for group, key in [("model", "n_layers"), ("model", "n_heads"), ("model", "context"), ("train", "max_steps"),
                       ("train", "batch_size"), ("optim", "warmup_steps")]:  # fmt: skip
        assert base[group][key] == transfer[group][key], key
    assert transfer["train"]["max_steps"] >= 1000
    assert float(base["optim"]["lr"]) in lr_grid("lr_transfer")


@pytest.mark.parametrize("ladder", sorted(BASE_OF))
def test_a_mup_ladder_trains_each_arm_at_its_base_sweeps_best_output_multiplier(ladder):
    """A base study tunes μP's output multiplier a_out with the LR per arm at rung 0 of its ladder (the largest
    budget); the ladder trains every rung of an arm at that arm's best cell's a_out (results/<base>/comparisons.csv,
    mean final val loss over seeds), inside both grids, and its rung-0 LR grid brackets the cell's LR. The base runs
    are rung 0 of the ladder: the same config but for the ladder keys, at the ladder's budget 1 of each arm.
    ladder_optimizer, where that a_out does not transfer to the wider rungs, trains each arm at a_out 1 too and
    fits each cell at the better of the two (ladder.tune)."""
    from lm_ablate.ladder import set_budget

    base = BASE_OF[ladder]
    arm_key = next(k for k in ("arch", "activation", "optim") if k in params(base))
    cells = base_cells(base)
    swept = {(j[arm_key], float(j["model.mup_output_mult"]), float(j["optim.lr"])) for j in jobs(base)}
    assert len(cells) == len(swept)  # every cell of the sweep has a row
    default = experiment(ladder)["model"]["mup_output_mult"]
    for arm in {a for a, _, _ in swept}:
        own = {c: loss for c, loss in cells.items() if arm in dict(c).values()}  # arch=, activation.name=, optim.name=
        values = dict(min(own, key=own.__getitem__))
        a_out, lr = float(values["model.mup_output_mult"]), float(values["optim.lr"])
        outs = sorted({o for a, o, _ in swept if a == arm})
        lrs = sorted({r for a, o, r in swept if a == arm and o == a_out})
        assert outs[0] < a_out < outs[-1] and lrs[0] < lr < lrs[-1], (arm, a_out, lr)  # inside both grids
        trains = [j for j in jobs(ladder) if j[arm_key] == arm]
        # a ladder that tunes a_out per cell (ladder.tune) also trains the arm at microsoft/mup's default, 1
        also = {1.0} if "model.mup_output_mult" in (experiment(ladder)["ladder"].get("tune") or []) else set()
        assert {float(j.get("model.mup_output_mult", default)) for j in trains} == {a_out} | also, arm
        trains = [j for j in trains if float(j.get("model.mup_output_mult", default)) == a_out]
        rung0 = sorted({float(j["optim.lr"]) for j in trains if j["ladder.rung"] == "0"})
        assert rung0[0] < lr < rung0[-1], (arm, lr, rung0)
    for job in jobs(base):
        if job["seed"] != "0" or job["model.mup_output_mult"] not in ("1", "8"):
            continue
        overrides = [f"{k}={job[k]}" for k in (arm_key, "optim.lr", "model.mup_output_mult")]
        tokens = [f"train.max_tokens={job['train.max_tokens']}"] if "train.max_tokens" in job else []
        tuned = compose([f"experiment={base}", *overrides, *tokens])
        rung = compose([f"experiment={ladder}", *overrides, "ladder.rung=0", "ladder.budget=1"])
        set_budget(rung, 256)  # byte-level Shakespeare
        for group in ("model", "optim", "train", "eval", "data", "regularization", "norm", "position", "activation",
                      "attention"):  # fmt: skip
            assert tuned[group] == rung[group], (job, group)


# studies whose claims are still to be written (issue 14 gives their schema; remove a study once it has them)
@pytest.mark.parametrize("study", sorted(REQUIRED - NO_CLAIMS))
def test_claims_parse_and_refer_to_arms_of_the_study(study):
    """Every shipped study states its claims (lm_ablate/claim_spec.py), and each names a key the sweep varies and
    values its arms have: the check the sweep runs before any job starts, here on the study's own arms."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from lm_ablate.claim_spec import parse_claims
    from lm_ablate.config import CONF_DIR
    from lm_ablate.study import SWEEPS_DIR
    from lm_ablate.sweep_check import ArmChecker, claim_errors, sweep_arms

    overrides = [f"hydra.searchpath=[file://{CONF_DIR}]", "hydra.sweep.dir=/nonexistent"]
    with initialize_config_dir(str(SWEEPS_DIR), version_base="1.3"):
        master = GlobalHydra.instance().hydra.compose_config(study, overrides, run_mode=RunMode.MULTIRUN)
        claims = parse_claims(OmegaConf.to_container(master.claims))
        assert claims and all(c.source and c.statement for c in claims)
        checker, arms = ArmChecker(master), sweep_arms(master)
        assert [checker.error(arm) for arm in arms] == [None] * len(arms)
        assert claim_errors(master, checker) == []
        assert len(checker.claim_arms) == 1  # every arm carries the same claims


@pytest.mark.parametrize("study", ["norm_2x2", "attention", "norm_placement"])
def test_sweep_file_composes_through_the_cli(study):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_ablate.train",
            "--config-dir",
            "sweeps",
            "--config-name",
            study,
            "--cfg",
            "job",
            "hydra.sweep.dir=/tmp/unused",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"study: {study}" in out.stdout


@pytest.mark.parametrize("where", ["hydra.sweep.dir=pvs", "--out=pvs"])
def test_study_reports_on_the_folder_its_runs_went_to(where, tmp_path, cache_dir):
    """A Hydra user's habit, ``hydra.sweep.dir=DIR``, is the study's ``--out DIR``: the runs go there and the
    report is built from them (it once looked in multirun/<study>/<time> and found nothing). Relative to the
    directory the command runs in, as Hydra takes it."""
    # one LR of the study's grid: 2 runs
    tiny = ["model=tiny", "train.max_steps=2", "train.eval_every=1", "train.eval_batches=1", "train.threads=1",
            "optim.lr=6e-3"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "lm_ablate.study", "parallel_vs_serial", where, "seed=0", "tracking=none",
         f"data.cache_dir={cache_dir}", *tiny],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    folder = tmp_path / "pvs"
    assert out.stdout.strip().splitlines()[-1] == str(folder / "report" / "report.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pvs"]  # no multirun/parallel_vs_serial/<time>
    assert all((folder / job / "summary.json").is_file() for job in ("0", "1"))
    report = (folder / "report" / "report.md").read_text()
    assert "Runs: 2 (2 completed)" in report and "## 1. model.block: parallel vs serial" in report


@pytest.mark.slow
def test_ctrl_c_stops_a_study_in_two_lines_and_the_same_command_continues(tmp_path, cache_dir):
    """Ctrl-C reaches the whole foreground process group: the running job checkpoints and says where it stopped,
    the study says how to continue; no traceback (it printed 88 lines of two). Then the printed command finishes
    the sweep: the finished job is kept as recorded, the interrupted one resumes."""
    import json
    import os
    import signal
    import time

    tiny = ["model=tiny", "train.max_steps=300", "train.eval_every=100", "train.eval_batches=1", "train.threads=1",
            "train.progress=false", "optim.lr=6e-3"]  # fmt: skip
    cmd = [sys.executable, "-m", "lm_ablate.study", "parallel_vs_serial", "seed=0", "tracking=none",
           f"data.cache_dir={cache_dir}", "train.checkpoint_every=1000", "--out", str(tmp_path / "pvs"), *tiny]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    second = tmp_path / "pvs" / "1" / "metrics.jsonl"
    deadline = time.time() + 300
    while not (second.exists() and second.read_text().count("\n") > 20) and time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 2, err[-2000:]
    assert lines[0].startswith("lm-ablate: interrupted at step") and lines[1].startswith("lm-ablate: interrupted after")
    assert lines[1].endswith(" ".join([*cmd[3:4], "--out", str(tmp_path / "pvs"), *cmd[4:8], *cmd[10:]]))
    first_done = (tmp_path / "pvs" / "0" / "summary.json").read_bytes()
    summary = json.loads((tmp_path / "pvs" / "1" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and (tmp_path / "pvs" / "1" / "checkpoints").is_dir()
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "pvs" / "0" / "summary.json").read_bytes() == first_done
    resumed = json.loads((tmp_path / "pvs" / "1" / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] == [summary["steps"]]
