"""Every trainer's hyperparameters, one pydantic config per stage (seeded; the same seed on CPU gives
byte-identical weights), and loading them from YAML with errors naming the file and the field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fugu_pipeline.config_files import Seed
from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.oneshot.kinds import LINEAR_HEAD_KINDS

# --------------------------------------------------------------------------- configs


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: Seed = 0
    head: str = Field("layernorm_linear", description=f"one of {LINEAR_HEAD_KINDS}")

    @field_validator("head")
    @classmethod
    def _known_head(cls, v: str) -> str:
        if v not in LINEAR_HEAD_KINDS:
            raise ValueError(f"unknown head {v!r}; SFT, RL and CMA-ES train one of {list(LINEAR_HEAD_KINDS)} "
                             "(kNN, domain prior, MLP and ensembles: fugu-lite train with configs/train.yaml)")
        return v


class SFTConfig(_Config):
    temperature: float = Field(0.2, gt=0, description="soft targets softmax(U / temperature)")
    loss: Literal["ce", "kl"] = "ce"
    lr: float = Field(5e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    epochs: int = Field(100, ge=1)
    batch_size: int = Field(64, ge=1)
    patience: int = Field(15, ge=1, description="epochs without a better validation utility before stopping")
    quality_cost_weight: float | None = Field(
        None, ge=0, description="quality head only: lambda in quality - lambda*cost; None = w_c/w_q of the utility config"
    )


class RLConfig(_Config):
    estimator: Literal["reinforce", "expected_reward"] = "reinforce"
    samples_per_task: int = Field(8, ge=1, description="REINFORCE actions sampled per task and step")
    entropy_coef: float = Field(0.01, ge=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    epochs: int = Field(50, ge=1)
    batch_size: int = Field(64, ge=1)
    patience: int = Field(10, ge=1)


class ESConfig(_Config):
    population_size: int | None = Field(
        None, ge=2, description="None = the cmaes default 4 + floor(3 ln n), n = number of evolved weights"
    )
    sigma0: float = Field(0.02, gt=0, description="initial step size; small when warm-started")
    generations: int = Field(300, ge=1)
    val_every: int = Field(10, ge=1, description="evaluate the mean and the generation's best on val this often")


# --------------------------------------------------------------------------- the configured set (configs/train.yaml)


class _Grid(BaseModel):
    # NaN or infinity in any figure of train.yaml is refused at load, naming the field (it used to
    # reach the heads and fail after the encoding, or be saved as a null hyperparameter)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


_NonNeg = Annotated[float, Field(ge=0)]
_Pos = Annotated[float, Field(gt=0)]
_PosInt = Annotated[int, Field(ge=1)]


class PriorGrid(_Grid):
    m: list[_NonNeg] = Field([5.0, 20.0, 100.0], min_length=1, description="pseudo-rows of shrinkage to the pooled mean")


class KNNGrid(_Grid):
    k: list[_PosInt] = Field([30, 100, 300], min_length=1)
    prior_weight: list[_NonNeg] = Field([0.0, 30.0], min_length=1, description="the domain prior as this many pseudo-neighbours")
    same_domain_bonus: list[_NonNeg] = Field([0.0, 1.0], min_length=1, description="added to the cosine of same-domain neighbours")
    temperature: list[_Pos | None] = Field([None], min_length=1, description="None: uniform weights; T: softmax(sim / T)")
    prior_m: float = Field(20.0, ge=0, description="shrinkage of the prior inside kNN")


class RidgeGrid(_Grid):
    alpha: list[float] = Field([10.0, 100.0, 1000.0, 10000.0], min_length=1, description="L2 penalty on standardised columns")
    inputs: list[Literal["all", "embedding", "lexical"]] = Field(
        ["all", "lexical"], min_length=1,
        description="feature columns read; 'lexical' (the 16 statistics alone) applies only when the encoder has lexical on, "
                    "and 'embedding' equals 'all' without it, so such points are skipped")
    domain_onehot: bool = Field(True, description="add the standardised one-hot of the domain (unknown: the average)")

    @field_validator("alpha")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(a <= 0 for a in v):
            raise ValueError(f"ridge alpha must be > 0, got {v}")
        return v


class MLPGrid(_Grid):
    hidden: list[Annotated[int, Field(ge=0)]] = Field([256], min_length=1, description="0 = logistic regression")
    epochs: list[_PosInt] = Field([30], min_length=1)
    weight_decay: list[_NonNeg] = Field([0.01], min_length=1)
    dropout: list[Annotated[float, Field(ge=0, lt=1)]] = Field([0.3], min_length=1)
    lr: float = Field(1e-3, gt=0)
    n_models: int = Field(3, ge=1, description="bag of seeds, averaged")
    batch_size: int = Field(128, ge=1)


class SFTGrid(_Grid):
    head: list[str] = Field(["quality"], min_length=1, description="linear kinds trained by SFT")
    lr: list[_Pos] = Field([0.003], min_length=1)
    weight_decay: float = Field(0.01, ge=0)
    epochs: int = Field(150, ge=1)
    patience: int = Field(30, ge=1)

    @field_validator("head")
    @classmethod
    def _linear(cls, v: list[str]) -> list[str]:
        bad = [h for h in v if h not in LINEAR_HEAD_KINDS]
        if bad:
            raise ValueError(f"sft trains linear heads only ({list(LINEAR_HEAD_KINDS)}), got {bad}")
        return v


class EnsembleConfig(_Grid):
    rounds: int = Field(10, ge=1, description="greedy forward-selection rounds (with replacement)")
    per_family: int = Field(2, ge=1, description="best configurations of each quality-predictor kind offered as members")


class HeadGrids(_Grid):
    domain_prior: PriorGrid | None = PriorGrid()
    knn: KNNGrid | None = KNNGrid()
    ridge: RidgeGrid | None = RidgeGrid()
    mlp: MLPGrid | None = None
    sft: SFTGrid | None = None
    ensemble: EnsembleConfig | None = EnsembleConfig()


class FeatureChoiceConfig(_Grid):
    """The features the heads read, beyond the encoder's own settings; each choice is made on
    validation and recorded in the checkpoints' feature contract and metrics."""

    lexical: bool = Field(True, description="append the 16 lexical statistics (length, numbers, structure) to each "
                          "vector; ridge and the MLP read them, kNN's cosine does not")
    layer_sets: Literal["auto", "off"] | list[list[int]] = Field(
        "auto", description="encoder layer settings to choose from on validation: auto = the last layer alone and "
        "with the middle one ([-1] and [-1, n/2]) when the encoder reads only its last layer; off = the encoder's "
        "layers; or a list such as [[-1], [-1, 3]]")
    prompt_rules: Literal["auto", "on", "off"] = Field(
        "auto", description="strip the text a domain's training prompts share: auto = with and without, the better "
        "on validation")

    @field_validator("layer_sets")
    @classmethod
    def _sets(cls, v):
        if isinstance(v, list) and (not v or any(not s for s in v)):
            raise ValueError("layer_sets: give auto, off, or a list of non-empty settings such as [[-1], [-1, 3]]")
        return v


class TrainSetConfig(_Grid):
    """`configs/train.yaml`: which heads `fugu-lite train` and the `router_heads` asset fit, their
    grids, and how one is chosen (K-fold out-of-fold over the non-test rows; never the test split)."""

    seed: Seed = 0
    folds: int = Field(5, ge=2, description="K of the K-fold out-of-fold predictions (folds by hash of the task id)")
    selection_rule: Literal["auto", "pooled", "macro", "blend"] = Field(
        "auto", description="auto: the rule that holds up in the nested check; two workers always use APGR")
    objective: Literal["oof", "lodo"] = Field(
        "oof", description="oof: K-fold over all non-test rows; lodo: leave one domain out (domain unknown at routing), "
        "for traffic from domains not in training")
    heads: HeadGrids = HeadGrids()
    features: FeatureChoiceConfig = FeatureChoiceConfig()
    cascade: CascadeConfig = Field(default_factory=CascadeConfig, description="cascades over the workers' replies "
                                   "(policies/cascade/config.py), selected against the heads and the best worker")
