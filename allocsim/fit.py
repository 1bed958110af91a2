"""The largest value of a script's knob that fits each GPU: ``fit(["python", "train.py", "--batch", "{B}"], gpus)``.

``allocsim fit`` in four steps, each one an existing part of allocsim:

1. **capture** the script (``torch_capture.session.capture``) at two or more small values of its one
   ``{NAME}`` placeholder, ``steps`` optimizer steps each, once per *capture class* of the GPUs asked
   (``capture_class``: what a capture reads of the card -- cuBLAS workspace size, attention kernels,
   bf16 -- follows the compute capability's major version; within a class one card's capture stands
   for the others, and the answer says which card it was captured for);
2. **scale** the captures (``scale.Scaler``): each allocation's size as a law of the value. Where two
   captures straddle a kernel switch (allocations on one side only, or sizes that seem to fall),
   one more capture is made at twice the largest value, up to ``MAX_EXTRA_CAPTURES``, and the laws
   come from the largest captures that agree (``_choose_inputs``): the answer lies above them;
3. **search** the largest value that fits each GPU (``scale.findmax.find_max``): the memory the card
   leaves the caching allocator (``gpus.allocator_capacity``; the captures hold their cuBLAS
   workspaces), with PyTorch's defaults and with the best setting ``advise`` finds;
4. **bound** the answer where the inputs leave sizes open: the same search on the low and the high
   end of the prediction's range, with the answer's setting (``value_range``); and hold it to the GPU
   estimate (``gpus.gpu_estimate``'s ``fits``, with the margin it keeps): a value it says does not fit
   is lowered to the largest that does (``_held_to_estimate``), and the memory left free is stated.

The captures are written to a folder (kept when the caller names it) with the script's output
beside each, so ``allocsim scale`` can replay the search and ``allocsim run`` any capture.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import tempfile
import time
from fractions import Fraction
from typing import Any, Callable, Sequence

from .errors import AllocsimError
from .gpus import GpuModel, allocator_capacity, find_gpu, gpu_estimate, label_note
from .metrics.verdict import incomplete_line
from .units import format_bytes

#: The values captured when none are given: small, yet past the smallest sizes where kernels take other
#: paths (batch 1; CUDA reductions take no global buffer at batch 2 of traces/fit_example.py; a 1,024-token
#: GPT's embedding backward sorts from 4,096 indices on, batch 4), so that both lie on the side of the
#: answer; a switch between them is found and a third capture made (``_choose_inputs``).
DEFAULT_VALUES = (4, 8)
#: Optimizer steps per capture: the first makes the optimizer's state, the second is the first step
#: that runs forward and backward with it alive and reuses the first step's cached blocks.
DEFAULT_STEPS = 2
#: The GPUs answered when none are asked: a consumer card, and the two data-centre cards most rented.
DEFAULT_GPUS = ("RTX 4090", "A100 80GB", "H100")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: A value fit captures or answers: ASCII digits (``str.isdigit`` takes ``²`` too), at most 9 of them.
_WHOLE = re.compile(r"[0-9]{1,9}")
MAX_VALUE = 999_999_999
#: Captures fit adds, each at twice the largest value so far, when two captures disagree (a kernel switch).
MAX_EXTRA_CAPTURES = 2
#: Search no further than this many times the largest value captured unless --max-value says otherwise.
DEFAULT_MAX_FACTOR = 1024
#: A knob whose name says it is a length gets the sequence laws (c*v^2 allowed: attention scores).
_SEQ_NAME = re.compile(r"seq|len|ctx|context|token", re.IGNORECASE)
EXIT_NOTHING_FITS = 1


class ScriptFailed(AllocsimError):
    """A capture did not finish: ``status`` is its exit status (3 raised or killed, 4 refused, 124 timeout, 130 interrupted, 2 start)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


# ----------------------------------------------------------------------------------------- input
def knob_of(command: Sequence[str]) -> str:
    """The one ``{NAME}`` placeholder of ``command`` (it may appear in several words); ValueError otherwise."""
    names = sorted({m for word in command for m in PLACEHOLDER.findall(word)})
    if not names:
        raise ValueError("no {NAME} placeholder in the command: write the value to vary as e.g. --batch {B}")
    if len(names) > 1:
        raise ValueError(f"{len(names)} placeholders in the command ({', '.join('{' + n + '}' for n in names)}): "
                         "fit varies one; write the others' values")
    return names[0]


def with_value(command: Sequence[str], knob: str, value: int) -> list[str]:
    """``command`` with every ``{knob}`` replaced by ``value``."""
    return [word.replace("{" + knob + "}", str(value)) for word in command]


def parse_values(text: str) -> list[int]:
    """``"2,4"`` -> ``[2, 4]``: two or more distinct whole numbers >= 1, sorted (ASCII digits: ``"²"`` is no number)."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not _WHOLE.fullmatch(part) or int(part) < 1:
            raise ValueError(f"--values {text!r}: {part!r} is not a whole number from 1 to {MAX_VALUE:,} "
                             "(e.g. --values 4,8)")
        values.append(int(part))
    distinct = sorted(set(values))
    if len(distinct) < 2:
        raise ValueError(f"--values {text!r}: give two or more different values (the laws need two points), "
                         "e.g. --values 4,8")
    return distinct


def scale_name_for(knob: str) -> str:
    """``seq`` for a knob named like a length (``{SEQ}``, ``{ctx_len}``), else ``batch``."""
    return "seq" if _SEQ_NAME.search(knob) else "batch"


def capture_class(gpu: GpuModel) -> str:
    """What the capture depends on, coarsely: the compute capability's major version, in words."""
    major = gpu.sm // 10
    if major >= 9:
        return "sm 9.x and newer"
    if major == 8:
        return "sm 8.x"
    return f"sm {major}.x"


def group_gpus(gpus: Sequence[GpuModel], per_gpu: bool = False) -> list[tuple[GpuModel, list[GpuModel]]]:
    """``(the card captured for, the cards it answers)`` per capture class, in the order asked.

    The first card asked of a class is captured for; ``per_gpu`` captures for every card.
    """
    groups: dict[str, tuple[GpuModel, list[GpuModel]]] = {}
    for gpu in gpus:
        key = gpu.name if per_gpu else capture_class(gpu)
        groups.setdefault(key, (gpu, []))[1].append(gpu)
    return list(groups.values())


def what_differs(captured_for: GpuModel, gpu: GpuModel) -> str:
    """What a capture made for ``captured_for`` does not know of ``gpu`` (same class), in one clause ("": nothing)."""
    if captured_for.sm_count != gpu.sm_count or captured_for.max_threads_per_sm != gpu.max_threads_per_sm:
        return (f"CUDA reductions' global buffers and flash-attention backward's split follow its "
                f"{captured_for.sm_count} SMs, not {gpu.sm_count}; --per-gpu captures for this card")
    return "the same SM count: only the name and memory torch.cuda reports differ"


def shell_words(command: Sequence[str]) -> str:
    """``command`` as one line to paste, the ``{NAME}`` placeholders left bare."""
    return " ".join(w if re.fullmatch(r"[\w@%+=:,./{}-]+", w) else shlex.quote(w) for w in command)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def _script_stem(command: Sequence[str]) -> str:
    from .commands.capture import default_output

    return default_output(list(command)).rsplit(".capture.parquet", 1)[0]


# ----------------------------------------------------------------------------------------- results
@dataclasses.dataclass
class CaptureRun:
    """One capture fit made."""

    value: int
    gpu: str                      # the card it was captured for
    path: str | None              # None once deleted (no -o DIR)
    log: str | None               # the script's stdout and stderr
    seconds: float
    allocs: int
    peak_reserved_bytes: int
    status: int = 0               # the capture's exit status (0: the script reached its steps or its end)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class GpuAnswer:
    """The largest value that fits one GPU, its setting, the predicted total, and how sure."""

    gpu: GpuModel
    captured_for: str
    capture_note: str             # what the capture does not know of this card ("" when captured for it)
    capacity_bytes: int           # what the card leaves the caching allocator
    value: int | None             # the largest value that fits with the best setting (None: not even the smallest)
    at_limit: bool                # the search stopped at its limit: the answer is at least ``value``
    setting: str                  # PYTORCH_CUDA_ALLOC_CONF of that setting ("" = PyTorch's defaults)
    run_args: list[str]           # ``allocsim run`` options that replay it
    estimate: dict[str, Any] | None   # ``gpus.gpu_estimate`` at the answer (None when nothing fits)
    first_failing: int | None
    why_not: str                  # why the next value does not fit (or why nothing does)
    defaults_value: int | None    # the largest with PyTorch's defaults
    defaults_estimate: dict[str, Any] | None
    defaults_why_not: str
    range_low: int | None         # the largest value that fits at the high end of the sizes' range
    range_high: int | None        # ... at the low end (the answer lies between; equal when determined)
    range_note: str
    bound_value: int | None       # no setting can fit past this (peak live bytes)
    extrapolation: float | None
    gpu_note: str | None          # an unverified card's label note (gpus.label_note)
    find_max: dict[str, Any]
    limiting_rank: int | None = None           # a distributed job: the lowest rank of the role that stops first
    per_role: list[dict[str, Any]] | None = None   # a distributed job: each role's ranks and answer
    #: The largest value that fits with the unknown terms (gpu_ranges) at their point estimates, with the
    #: answer's setting (``value`` is searched at their high end: FITS only when the high end fits).
    point_value: int | None = None
    point_first_failing: int | None = None
    point_capacity_bytes: int | None = None
    #: Why the laws come from some captures only (a kernel switch between them; "" when from all).
    inputs_note: str = ""
    #: The values whose captures the laws are fitted from.
    fitted_from: list[int] = dataclasses.field(default_factory=list)
    #: The card's memory left free at the predicted total (``estimate``), and the value the search found
    #: before the GPU estimate's ``fits`` was held (None: it fitted as found).
    margin_bytes: int | None = None
    lowered_from: int | None = None
    #: The capture fit made at its answer to confirm it (``confirm``): True it fits there, False it does not
    #: (after the rounds allowed), None not checked; the line that says so.
    confirmed: bool | None = None
    confirm_note: str = ""

    @property
    def fits(self) -> bool:
        return self.value is not None

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("gpu", "find_max")}
        data = {"gpu": self.gpu.name, "gpu_total_bytes": self.gpu.total_bytes, "gpu_total_verified": self.gpu.verified,
                **data, "setting_line": self.setting_line, "find_max": self.find_max}
        return data

    @property
    def setting_line(self) -> str:
        return f"PYTORCH_CUDA_ALLOC_CONF={self.setting}" if self.setting else "defaults"


@dataclasses.dataclass
class FitResult:
    """Everything ``fit`` found; ``to_dict()`` for JSON, ``format_text()`` for people."""

    command: list[str]
    knob: str
    scale_name: str
    values: list[int]
    steps: int
    captures: list[CaptureRun]
    answers: list[GpuAnswer]
    capture_seconds: float
    search_seconds: float
    out_dir: str | None           # where the captures are kept (None: deleted)
    replay: list[str]             # ``allocsim scale ... --find-max`` per capture class (with out_dir)
    #: Why a capture stopped before the script's end ("" when all are complete; only with allow_incomplete).
    incomplete: str = ""
    torch: dict[str, Any] = dataclasses.field(default_factory=dict)   # ``torch_release.inputs_check``
    #: The values captured to confirm answers (``_confirm``), apart from those the laws are fitted from.
    confirm_values: list[int] = dataclasses.field(default_factory=list)

    @property
    def any_fits(self) -> bool:
        return any(a.fits for a in self.answers)

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.command, "knob": self.knob, "scale_name": self.scale_name, "values": self.values,
                "steps": self.steps, "captures": [c.to_dict() for c in self.captures],
                "answers": [a.to_dict() for a in self.answers], "capture_seconds": round(self.capture_seconds, 3),
                "search_seconds": round(self.search_seconds, 3), "out_dir": self.out_dir, "replay": self.replay,
                "torch": self.torch, "confirm_values": self.confirm_values,
                "method": METHOD,
                **({"incomplete": True, "incomplete_reason": self.incomplete} if self.incomplete else {})}

    def format_text(self) -> str:
        name = self.knob
        law_values = [v for v in self.values if v not in self.confirm_values] or list(self.values)
        n_law = sum(1 for c in self.captures if c.value in law_values)
        classes: dict[str, list[str]] = {}
        for answer in self.answers:
            classes.setdefault(answer.captured_for, []).append(answer.gpu.name)
        said = [rep + (f" (standing for {', '.join(g for g in gpus if g != rep)} too)" if len(gpus) > 1 else "")
                for rep, gpus in classes.items()]
        lines = [f"allocsim fit: {shell_words(self.command)}",
                 f"  captured: {name} = {', '.join(map(str, law_values[:-1]))} and {law_values[-1]}, "
                 + (f"{self.steps} optimizer steps each" if self.steps else "each to the end of the script")
                 + f", for {' and '.join(said)}: {n_law} captures, {self.capture_seconds:.1f} s",
                 f"  searched: the largest {name} on the traces predicted from them ({self.scale_name} laws), "
                 f"against each GPU's memory less the libraries and the CUDA context (and cuDNN's terms) at the high "
                 f"end of their ranges"
                 + (f", then each answer captured to confirm it ({name} = {', '.join(map(str, self.confirm_values))}: "
                    f"{len(self.captures) - n_law} capture{'s' if len(self.captures) - n_law != 1 else ''})"
                    if self.confirm_values else "")
                 + f": {self.search_seconds:.1f} s"]
        if self.torch.get("trace_torch"):
            lines.append(f"  torch: {self.torch['trace_torch']} (the interpreter's: the answers hold for a GPU run "
                         "with this release)")
        if self.torch.get("note"):
            lines.append(f"  note: {self.torch['note']}")
        lines.append("")
        for a in self.answers:
            label = "" if a.gpu.verified else ", label"
            head = f"{a.gpu.name} ({format_bytes(a.gpu.total_bytes)}{label})"
            said_incomplete = ((lambda line: incomplete_line(self.incomplete, line)) if self.incomplete else
                               (lambda line: line))
            if a.value is None:
                lines.append(said_incomplete(f"{head}: nothing fits, not even {name} = {a.first_failing}: "
                                             f"{a.why_not}"))
            else:
                est = a.estimate or {}
                at_least = "at least " if a.at_limit else ""
                lines.append(said_incomplete(f"{head}: {name} = {at_least}{a.value} with {a.setting_line}"))
                spread = (f" ({format_bytes(est['total_low_bytes'])} to {format_bytes(est['total_high_bytes'])})"
                          if "total_low_bytes" in est and "total_high_bytes" in est else "")
                lines.append(f"  predicted total {format_bytes(est.get('total_bytes', 0))}{spread} of "
                             f"{format_bytes(a.gpu.total_bytes)}: reserved peak "
                             f"{format_bytes(est.get('reserved_peak_bytes', 0))} (cuBLAS workspaces included) + "
                             f"libraries {format_bytes(est.get('library_bytes', 0))}"
                             + "".join(f" + {t['label']} {format_bytes(t['bytes'])} ({format_bytes(t['low_bytes'])} "
                                       f"to {format_bytes(t['high_bytes'])})"
                                       for t in (est.get("unknown_terms") or {}).values()))
                if a.margin_bytes is not None:
                    lowered = (f"; lowered from {a.lowered_from}, where the GPU estimate does not fit"
                               if a.lowered_from is not None else "")
                    lines.append(f"  margin: {format_bytes(a.margin_bytes)} of the card left free at the predicted "
                                 f"total (the GPU estimate fits){lowered}")
                if a.point_value is not None and a.point_value != a.value:
                    lines.append(f"  {a.value} fits with every unknown term at its high end; at their point "
                                 f"estimates {name} = {a.point_value} fits with the same setting"
                                 + (f" ({a.point_first_failing} does not)" if a.point_first_failing else ""))
                if a.at_limit:
                    lines.append(f"  the search stopped at its limit ({a.value}); give --max-value to look further")
                elif a.first_failing is not None:
                    lines.append(f"  {name} = {a.first_failing}: {a.why_not}")
                if a.setting:
                    if a.defaults_value is None:
                        lines.append(f"  with PyTorch's defaults nothing fits: {a.defaults_why_not}")
                    else:
                        dest = a.defaults_estimate or {}
                        unconfirmed = "; not confirmed by a capture" if a.confirmed is not None else ""
                        lines.append(f"  with PyTorch's defaults: {name} = {a.defaults_value} (predicted total "
                                     f"{format_bytes(dest.get('total_bytes', 0))}{unconfirmed})")
                lines.append(f"  range: {self._range_text(a)}")
                if a.extrapolation is not None and a.extrapolation > 2:
                    lines.append(f"  {a.value} is {a.extrapolation:.3g}x the largest value its laws come from "
                                 f"({max(a.fitted_from or law_values)})"
                                 + ("" if a.confirmed else ": confirm it with one capture (below)"))
            if a.confirm_note:
                lines.append(f"  {a.confirm_note}")
            if a.inputs_note:
                lines.append(f"  {a.inputs_note}")
            if a.limiting_rank is not None and a.per_role:
                limit = next((r for r in a.per_role if a.limiting_rank in r["ranks"]), None)
                others = "; ".join(f"ranks {r['ranks_text']}: {r['value'] if r['value'] is not None else 'nothing'}"
                                   for r in a.per_role)
                lines.append(f"  limiting rank {a.limiting_rank}"
                             + (f" (ranks {limit['ranks_text']})" if limit else "") + f"; per role: {others}")
            if a.captured_for != a.gpu.name:
                lines.append(f"  captured for {a.captured_for}: {a.capture_note}")
            if a.estimate and a.estimate.get("caveat"):
                lines.append(f"  {a.estimate['caveat']}")
            elif a.gpu_note and a.value is None:
                lines.append(f"  note: {a.gpu_note}")
        lines.append("")
        best = next((a for a in self.answers if a.value is not None), None)
        if best is not None:
            at = with_value(self.command, self.knob, best.value)
            extra = [w for w in best.run_args if w not in ("--policy", "pytorch")]
            out = "at" if best.limiting_rank is not None else "at.parquet"    # a job's capture is a folder
            lines.append(f"confirm an answer: allocsim capture --gpu {shlex.quote(best.gpu.name)} --steps "
                         f"{self.steps} -o {out} -- {shell_words(at)}")
            lines.append(f"  then: allocsim run {out} --policy pytorch --gpu {shlex.quote(best.gpu.name)}"
                         + (" " + shlex.join(extra) if extra else ""))
        if self.out_dir:
            lines.append(f"captures and the script's output kept in {self.out_dir}; replay the search:")
            lines += [f"  {command}" for command in self.replay]
        else:
            lines.append("captures deleted (give -o DIR to keep them)")
        return "\n".join(lines)

    def _range_text(self, a: GpuAnswer) -> str:
        if a.range_low == a.range_high == a.value:
            return f"{a.value} ({a.range_note})"
        low = "nothing" if a.range_low is None else str(a.range_low)
        return f"{low} to {a.range_high} ({a.range_note})"


METHOD = ("each value captured on the CPU (allocsim capture: cuda on the meta device), the captures scaled "
          "(allocsim scale: each allocation's size a law of the value), the largest fitting value searched on the "
          "trace predicted at each value probed (scale --find-max: PyTorch's defaults, then allocsim advise), against "
          "the GPU's memory less the CUDA context and libraries as run --gpu counts them, with the terms a CPU run cannot "
          "know at the high end of their ranges (allocsim.gpu_ranges); point_value is the answer at their point "
          "estimates")


# ----------------------------------------------------------------------------------------- capture
LOG_HEADER = "# allocsim fit: output of "


def capture_paths(command: Sequence[str], knob: str, value: int, gpu: GpuModel, folder: str) -> tuple[str, str]:
    """The capture's trace and the script's output: ``DIR/train.B4.rtx-4090.parquet`` and ``.log``."""
    stem = f"{_script_stem(with_value(command, knob, value))}.{knob}{value}.{_slug(gpu.name)}"
    return os.path.join(folder, stem + ".parquet"), os.path.join(folder, stem + ".log")


def _is_fit_log(log: str) -> bool:
    """True for the script's output an ``allocsim fit`` wrote (its first line starts ``LOG_HEADER``)."""
    try:
        with open(log, "rb") as fh:
            return fh.read(len(LOG_HEADER)) == LOG_HEADER.encode()
    except OSError:
        return False


def check_capture_paths(paths: Sequence[tuple[str, str]]) -> None:
    """Refuse (ValueError, one line) before any capture a file in ``-o DIR`` that fit did not write."""
    from .output_file import check_trace_output as check_output
    from .output_file import check_output_file

    for path, log in paths:
        check_output(path)
        check_output_file(log, ours=_is_fit_log, what="the script's output an allocsim fit wrote")


def _capture_one(command: list[str], knob: str, value: int, gpu: GpuModel, folder: str, steps: int,
                 timeout_s: float | None) -> tuple[Any, CaptureRun]:
    from .output_file import open_output
    from .torch_capture.session import capture

    path, log = capture_paths(command, knob, value, gpu, folder)
    argv = with_value(command, knob, value)
    # The log grows at its name while the script runs (``open_output(live=True)``): created anew, never
    # through a link put at its name, and it replaces only a log fit wrote.
    with open_output(log, ours=_is_fit_log, what="the script's output an allocsim fit wrote", within=folder,
                     text=True, errors="backslashreplace", live=True) as fh:
        fh.write(f"{LOG_HEADER}`{shlex.join(argv)}` captured for {gpu.name}\n")
        fh.flush()
        result, _trace = capture(argv, path, steps=steps, gpu=gpu.capture_properties(), timeout_s=timeout_s,
                                 stdout=fh, stderr=fh)
    summary = result.summary or {}
    return result, CaptureRun(value, gpu.name, path if result.trace_path is not None else None, log, result.seconds,
                              int(summary.get("allocs", 0)), int(summary.get("peak_reserved_bytes", 0)),
                              int(result.status))


def _last_line(log: str) -> str:
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            lines = [line.strip() for line in fh if line.strip() and not line.startswith(LOG_HEADER)]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _failure(result: Any, run: CaptureRun, knob: str, kept: bool) -> ScriptFailed:
    """The one line that says which capture failed, its exit status, and the script's error line."""
    from .metrics.verdict import ALLOW_INCOMPLETE
    from .torch_capture.session import EXIT_CANNOT_START

    status = result.status if result.trace_path is not None else EXIT_CANNOT_START
    why = result.message or "no reason given"
    last = _last_line(run.log)
    error = ""
    if last and last not in why:
        error = f"; the script's last line: {last}"
    where = f" (its output: {run.log})" if kept else ""
    use = (f"; {ALLOW_INCOMPLETE} answers from the captures as they stopped" if result.trace_path is not None
           else "")
    return ScriptFailed(f"the capture at {knob} = {run.value} (for {run.gpu}) ended with exit status {status}: "
                        f"{why}{error}{where}{use}", status)


def capture_all(command: list[str], knob: str, values: Sequence[int], reps: Sequence[GpuModel], folder: str,
                steps: int, timeout_s: float | None, workers: int, kept: bool,
                log: Callable[[str], None], allow_incomplete: bool = False,
                jobs: Sequence[tuple[GpuModel, int]] | None = None, strict: bool = True) -> list[CaptureRun]:
    """Every (card, value) capture (or the ``jobs`` given), ``workers`` at a time; ``ScriptFailed`` for the
    first that did not finish (with ``allow_incomplete``: the first that wrote no trace; without
    ``strict``, none: each run's ``status`` and ``path`` say)."""
    jobs = list(jobs) if jobs is not None else [(gpu, value) for gpu in reps for value in values]
    runs: dict[tuple[str, int], tuple[Any, CaptureRun]] = {}
    at_once = max(1, min(workers, len(jobs)))
    until = f"to optimizer step {steps}" if steps else "to its end"
    shown = sorted({value for _, value in jobs})
    log(f"capturing {knob} = {', '.join(map(str, shown))} for {', '.join(dict.fromkeys(g.name for g, _ in jobs))}: "
        f"{len(jobs)} capture{'s' if len(jobs) > 1 else ''}, {at_once} at a time, each running the script {until}")
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=at_once) as pool:
        futures = {pool.submit(_capture_one, command, knob, value, gpu, folder, steps, timeout_s): (gpu, value)
                   for gpu, value in jobs}
        for future in concurrent.futures.as_completed(futures):
            gpu, value = futures[future]
            result, run = runs[(gpu.name, value)] = future.result()
            ended = "" if result.status == 0 else f", ended with exit status {result.status}"
            log(f"captured {knob} = {value} for {gpu.name} in {run.seconds:.1f} s{ended} ({len(runs)} of "
                f"{len(jobs)}, {time.monotonic() - started:.0f} s in all)")
    for gpu, value in jobs:           # the first failure in the order asked: the smallest value first
        result, run = runs[(gpu.name, value)]
        if strict and (result.trace_path is None or (result.status != 0 and not allow_incomplete)):
            raise _failure(result, run, knob, kept)
    return [runs[(gpu.name, value)][1] for gpu, value in jobs]


# ----------------------------------------------------------------------------------------- search
def value_range(scaler: Any, capacity_bytes: int, params: dict[str, Any] | None, value: int, multiple: int,
                limit_value: int) -> tuple[int | None, int | None, str]:
    """``(lower, upper, note)``: the largest value that fits with ``params`` at the high and at the low end.

    Where the inputs determine every size at ``value`` (no open range, or both ends equal), both are
    ``value``. Otherwise two searches with the one setting, one replay per probe: downward from
    ``value`` on the high ends (the value that fits whatever the open laws are) and upward from it on
    the low ends (the most the inputs allow).
    """
    from .metrics.verdict import GIVEN
    from .runner import Capacity, simulate_trace
    from .scale.findmax import largest_fitting
    from .scale.ranges import end_traces, recorded_range

    at = scaler.at(Fraction(value), with_range=False).trace
    rng = recorded_range(at)
    if end_traces(at) is None or rng is None or (rng["low"] == rng["high"]).all():
        return value, value, "the inputs determine every size at the answer"
    capacity = Capacity(capacity_bytes, GIVEN)

    def fits(k: int, end: int) -> bool:
        trace = scaler.at(Fraction(k * multiple), with_range=False).trace
        ends = end_traces(trace)
        chosen = trace if ends is None else ends[end]
        return bool(simulate_trace(chosen, "pytorch", params, capacity=capacity, fast=True).summary["verdict"]["fits"])

    k = value // multiple
    limit = max(k, limit_value // multiple)
    def high_end(j: int) -> bool:            # larger sizes: the value that fits whatever the open laws are
        return fits(j, 1)

    def low_end(j: int) -> bool:             # smaller sizes: the most the inputs allow
        return fits(j, 0)

    lower = k if high_end(k) else largest_fitting(high_end, 0, k, k)[0]
    upper = largest_fitting(low_end, k, None, limit, k)[0] if low_end(k) else k
    lower_value = lower * multiple if lower else None
    upper_value = max(upper * multiple, value)
    n_open = len(rng["alloc_id"])
    if lower_value == upper_value:
        return lower_value, upper_value, (f"{n_open} allocation sizes the inputs leave open; the same answer at both "
                                          "ends of their laws, with this setting")
    return lower_value, upper_value, (f"{n_open} allocation sizes the inputs leave open: the answer searched again "
                                      "at each end of their laws, with this setting (the lower fits whatever they "
                                      "are)")


def _answer(gpu: GpuModel, captured_for: GpuModel, found: Any, scaler: Any, capacity: int, in_trace: bool,
            multiple: int, limit_value: int, cudnn: bool = False, point_capacity: int | None = None,
            capture: bool = False) -> GpuAnswer:
    from .advise.knobs import preset_for

    best, recorded = found.best, found.recorded
    preset = preset_for("pytorch", None, capacity)
    params = best.at_value.params if best.at_value is not None else None
    setting = preset.alloc_conf(params) if params else ""
    run_args = list(best.at_value.run_args) if best.at_value is not None else []

    def estimate(answer: Any) -> dict[str, Any] | None:
        if answer.value is None or answer.at_value is None or answer.at_value.peak_reserved_bytes is None:
            return None
        return gpu_estimate(gpu, answer.at_value.peak_reserved_bytes, workspaces_in_trace=in_trace, cudnn=cudnn,
                            capture=capture, fits_high=True)

    def why_not(answer: Any) -> str:
        return answer.at_failing.line if answer.at_failing is not None else ""

    value, first_failing, best_estimate, why = best.value, best.first_failing, estimate(best), why_not(best)
    lowered_from = None
    if value is not None and best_estimate is not None and best_estimate.get("fits") is not True:
        lowered_from = value
        value, best_estimate, first_failing, failing = _held_to_estimate(
            gpu, scaler, params, capacity, in_trace, value, multiple,
            lambda reserved: gpu_estimate(gpu, reserved, workspaces_in_trace=in_trace, cudnn=cudnn, capture=capture,
                                          fits_high=True))
        why = (f"the GPU estimate does not fit: needs {format_bytes(failing['total_bytes'])} of "
               f"{format_bytes(gpu.total_bytes)}") if failing else why
    if value is not None:
        low, high, note = value_range(scaler, capacity, params, value, multiple, limit_value)
    else:
        low, high, note = None, None, "nothing fits"
    margin = None if best_estimate is None else int(gpu.total_bytes - best_estimate["total_bytes"])
    point_value = point_failing = None
    if point_capacity is not None and value is not None:
        from .scale.findmax import largest_with_setting

        point_value, point_failing = largest_with_setting(scaler, point_capacity, "pytorch", params,
                                                          value or multiple, multiple, limit_value)
    return GpuAnswer(
        gpu=gpu, captured_for=captured_for.name,
        capture_note="" if captured_for is gpu else what_differs(captured_for, gpu),
        capacity_bytes=capacity, value=value, at_limit=value is not None and first_failing is None,
        setting=setting, run_args=run_args, estimate=best_estimate, first_failing=first_failing,
        why_not=why if value is not None else (why_not(found.bound) or why),
        defaults_value=recorded.value, defaults_estimate=estimate(recorded), defaults_why_not=why_not(recorded),
        range_low=low, range_high=high, range_note=note, bound_value=found.bound.value,
        extrapolation=found.extrapolation() if value == best.value else
        (None if value is None else float(Fraction(value) / found.largest_input)),
        gpu_note=label_note(gpu), find_max=found.to_dict(), margin_bytes=margin, lowered_from=lowered_from,
        point_value=point_value, point_first_failing=point_failing, point_capacity_bytes=point_capacity)


def _held_to_estimate(gpu: GpuModel, scaler: Any, params: dict[str, Any] | None, capacity: int, in_trace: bool,
                      value: int, multiple: int, estimate_of: Callable[[int], dict[str, Any]]
                      ) -> tuple[int | None, dict[str, Any] | None, int, dict[str, Any] | None]:
    """The largest value up to ``value`` whose replay fits ``capacity`` with ``params`` *and* whose
    ``gpu_estimate`` says ``fits`` (the estimate may hold a margin the allocator's capacity does not:
    issue 38's ranges), with that estimate, then the first value that does not and its estimate;
    ``None`` for the first two when none does."""
    from .metrics.verdict import GIVEN
    from .runner import Capacity, simulate_trace
    from .scale.findmax import largest_fitting

    seen: dict[int, dict[str, Any] | None] = {}

    def fits(k: int) -> bool:
        trace = scaler.at(Fraction(k * multiple), with_range=False).trace
        summary = simulate_trace(trace, "pytorch", params, capacity=Capacity(capacity, GIVEN), fast=True).summary
        est = estimate_of(int(summary["peak_reserved_bytes"]))
        seen[k] = est
        return bool(summary["verdict"]["fits"]) and est.get("fits") is True

    k = value // multiple
    best, fail = largest_fitting(fits, 0, k, k)
    fail = k if fail is None else fail
    if fail not in seen:
        fits(fail)
    if not best:
        return None, None, fail * multiple, seen[fail]
    if best not in seen:
        fits(best)
    return best * multiple, seen[best], fail * multiple, seen[fail]


# ----------------------------------------------------------------------------------------- fit
def check_command(command: Sequence[str], values: Sequence[int] = DEFAULT_VALUES) -> str:
    """The knob of ``command`` once it names an interpreter and a script that can be run at every value
    of ``values`` (``session.check_script``; a script named ``cfg{B}.py`` is ``cfg4.py`` at 4: it is
    checked as each capture will run it); ValueError otherwise."""
    from .torch_capture.distributed.launchers import parse_launch
    from .torch_capture.command_line import script_of
    from .torch_capture.session import check_script

    command = list(command)
    if command:
        launch = parse_launch(with_value(command, knob_of(command), 1))
        if launch.launcher:
            if launch.script[:1] != ["-m"] and not os.path.isfile(launch.script[0]):
                raise ValueError(f"no script {launch.script[0]!r}")
            return knob_of(command)
    if not command or (len(command) < 2 and not command[0].endswith(".py")):
        raise ValueError("give the script after --, e.g. allocsim fit -- python train.py --batch {B}")
    knob = knob_of(command)
    named = script_of(command)[:1]
    for value in values:
        try:
            check_script(with_value(command, knob, value))
        except ValueError as exc:
            if named and "{" + knob + "}" in named[0]:
                raise ValueError(f"{exc} (the script at {knob} = {value})") from None
            raise
    return knob


def _runs_at(command: Sequence[str], knob: str, value: int) -> bool:
    try:
        check_command(command, [value])
    except ValueError:
        return False
    return True


def check_search(values: Sequence[int], multiple: int, max_value: int | None) -> int:
    """The search limit (``max_value``, or ``DEFAULT_MAX_FACTOR`` times the largest value), once
    ``--multiple-of`` and ``--max-value`` leave something to search (ValueError naming the option otherwise)."""
    if multiple < 1 or multiple > MAX_VALUE:
        raise ValueError(f"--multiple-of must be a whole number from 1 to {MAX_VALUE:,}, got {multiple}")
    if max_value is not None and not 1 <= max_value <= MAX_VALUE * DEFAULT_MAX_FACTOR:
        raise ValueError(f"--max-value must be from 1 to {MAX_VALUE * DEFAULT_MAX_FACTOR:,}, got {max_value}")
    limit = max_value if max_value is not None else DEFAULT_MAX_FACTOR * max(values)
    if multiple > limit:
        given = (f"--max-value {max_value}" if max_value is not None else
                 f"the search limit, {DEFAULT_MAX_FACTOR} times the largest value captured ({limit:,}; "
                 "--max-value sets it)")
        raise ValueError(f"--multiple-of {multiple:,} is larger than {given}: no multiple of it can be searched")
    return limit


def extra_values(values: Sequence[int], n: int = MAX_EXTRA_CAPTURES) -> list[int]:
    """The values fit may add when captures disagree: twice the largest, then twice that, ``n`` in all."""
    out, top = [], max(values)
    for _ in range(n):
        top *= 2
        out.append(top)
    return out


@dataclasses.dataclass
class InputsChoice:
    """The captures of one class the laws are fitted from, and why those (``note``: "" when all of them)."""

    runs: list[CaptureRun]
    scaler: Any
    note: str
    open_sizes: int                 # allocations found at one value only (their law is open)


def _choose_inputs(runs: Sequence[CaptureRun], loaded: dict[str, Any], scale_name: str, knob: str,
                   final: bool) -> tuple[InputsChoice | None, str]:
    """The captures to fit laws from: the longest run of the largest values that is one configuration
    and whose every allocation is found in each of them; None when another capture should be made.

    Two captures can straddle a kernel switch (CUDA's embedding backward sorts above 3,072 indices;
    reductions take global buffers past some size): allocations that exist on one side only, or
    whose size seems to fall as the value grows. The answer lies above the captured values, so the
    laws are taken from the captures above the switch, dropping the smaller ones; another capture
    at twice the largest value is asked for until two agree. With ``final`` (no capture left to
    make), the largest values that are one configuration are taken with their open sizes, or
    ``MixedInputs`` is raised for the largest pair. The second item says why the captures disagree.
    """
    from .scale.build import Scaler
    from .scale.consistency import MixedInputs

    runs = sorted(runs, key=lambda c: c.value)
    usable: InputsChoice | None = None
    refusal: MixedInputs | None = None
    for first in range(len(runs) - 1):
        chosen = runs[first:]
        try:
            scaler = Scaler([loaded[c.path] for c in chosen], scale_name)
            report = scaler.at(Fraction(2 * chosen[-1].value), with_range=False).report
        except MixedInputs as exc:
            refusal = refusal or exc
            continue
        dropped = runs[:first]
        note = ""
        if dropped:
            why = (refusal.differences[0].text if refusal is not None and refusal.differences else
                   "allocations found at one value only")
            note = (f"{knob} = {', '.join(str(c.value) for c in dropped)} and {chosen[0].value} differ ({why}): "
                    f"a kernel switch between them; laws fitted from {knob} = "
                    f"{', '.join(str(c.value) for c in chosen)}, which agree")
        choice = InputsChoice(list(chosen), scaler, note, int(report.unaligned))
        if report.unaligned == 0:
            return choice, ""
        usable = usable or choice
    why = (refusal.differences[0].text if refusal is not None and refusal.differences else
           f"{usable.open_sizes:,} allocations appear at {knob} = {usable.runs[-1].value} only" if usable else "")
    if not final:
        return None, why
    if usable is not None:
        if not usable.note:
            usable.note = (f"{usable.open_sizes:,} allocations appear only at {knob} = {usable.runs[-1].value} "
                           "(a kernel that switches past some size): their sizes past it are open (the range)")
        return usable, why
    raise refusal if refusal is not None else MixedInputs([])


def _refused(exc: Any, runs: Sequence[CaptureRun], knob: str) -> AllocsimError:
    """fit's one line for captures that never agree (``scale --allow-mixed`` is not fit's to offer)."""
    values = ", ".join(str(c.value) for c in sorted(runs, key=lambda c: c.value))
    differences = getattr(exc, "differences", None) or []
    why = differences[0].text if differences else str(exc)
    top = max(c.value for c in runs)
    if differences and differences[0].kind in ("shrinking", "alignment"):
        hint = (f"fit needs two captures on the same side of it: give --values where the script takes the path of "
                f"the answer (e.g. --values {2 * top},{4 * top})")
    else:
        hint = "fit needs captures of one configuration: the script must differ in the value only"
    return AllocsimError(f"the captures at {knob} = {values} are not one configuration: {why}; {hint}")


@dataclasses.dataclass
class _Search:
    """One GPU's search: the captures it reads (``choice``), its answer and the setting found."""

    gpu: GpuModel
    rep: GpuModel
    choice: InputsChoice
    capacity: int                  # the allocator's, at the high end of the unknown terms (gpu_ranges)
    in_trace: bool
    cudnn: bool = False
    capture: bool = False
    point_capacity: int | None = None
    answer: GpuAnswer | None = None
    params: dict[str, Any] | None = None

    def estimate(self, reserved_peak_bytes: int) -> dict[str, Any]:
        """``gpus.gpu_estimate`` of a reserved peak on this GPU, as the answer's is made."""
        return gpu_estimate(self.gpu, reserved_peak_bytes, workspaces_in_trace=self.in_trace, cudnn=self.cudnn,
                            capture=self.capture, fits_high=True)

    def run(self, knob: str, multiple: int, max_value: int | None, advise: bool, executor: Any) -> None:
        """Search the largest value (``find_max``) and make the answer (``_answer``) from ``choice``."""
        from .scale.consistency import MixedInputs
        from .scale.findmax import find_max

        scaler = self.choice.scaler
        try:
            found = find_max(scaler, self.capacity, policy="pytorch", multiple=multiple, max_value=max_value,
                             advise=advise, executor=executor)
            answer = _answer(self.gpu, self.rep, found, scaler, self.capacity, self.in_trace, multiple,
                             found.max_value, self.cudnn, self.point_capacity, self.capture)
        except MixedInputs as exc:     # below the captures another reference is used: still fit's line
            raise _refused(exc, self.choice.runs, knob) from None
        best = found.best
        self.params = best.at_value.params if best.at_value is not None else None
        answer.inputs_note = self.choice.note
        answer.fitted_from = [c.value for c in self.choice.runs]
        if self.answer is not None:            # a search again: keep what the first said
            answer.confirm_note = self.answer.confirm_note
        self.answer = answer


#: Captures at the answer fit makes per GPU to confirm it (the second after a search again).
CONFIRM_ROUNDS = 2


def _confirm(searches: Sequence[_Search], command: list[str], knob: str, folder: str, steps: int,
             timeout_s: float | None, workers: int, out_dir: str | None, allow_incomplete: bool,
             loaded: dict[str, Any], scale_name: str, multiple: int, advise: bool, executor: Any,
             log: Callable[[str], None]) -> list[CaptureRun]:
    """Capture each answer (for the card its class is captured for) and replay it with the answer's setting.

    A kernel that switches past the largest value captured (CUDA's embedding backward sorts above
    3,072 indices; layer norm's backward sums in blocks for many rows) is in no capture the laws
    came from, so the prediction misses it; a capture at the answer has it. Where the capture does
    not fit, it joins the inputs (``_choose_inputs``: its new allocations are carried at its own
    size), the search runs again below that value, and the new answer is captured in turn, up to
    ``CONFIRM_ROUNDS`` captures. Each answer says what its capture showed (``confirm_note``).
    Returns the captures made.
    """
    from .metrics.verdict import GIVEN
    from .runner import Capacity, simulate_trace
    from .scale.consistency import MixedInputs

    made: list[CaptureRun] = []
    todo = [search for search in searches if search.answer.value is not None]
    for round_ in range(CONFIRM_ROUNDS):
        if not todo:
            break
        jobs = list(dict.fromkeys((search.rep, search.answer.value) for search in todo))
        have = {(c.gpu, c.value): c for c in [*made, *(c for search in todo for c in search.choice.runs)]}
        need = [(rep, value) for rep, value in jobs if (rep.name, value) not in have]
        refused: dict[tuple[str, int], str] = {}
        if out_dir is not None:
            for rep, value in list(need):
                try:
                    check_capture_paths([capture_paths(command, knob, value, rep, folder)])
                except ValueError as exc:       # a file fit did not write is in the way: say so, capture nothing
                    refused[(rep.name, value)] = str(exc)
                    need.remove((rep, value))
        if need:
            log("confirming the answers with a capture at each: "
                + ", ".join(f"{knob} = {v} for {r.name}" for r, v in need))
            new = capture_all(command, knob, [], [], folder, steps, timeout_s, workers, out_dir is not None, log,
                              allow_incomplete, jobs=need, strict=False)
            made += new
            have.update({(c.gpu, c.value): c for c in new})
        still = []
        for search in todo:
            answer, value = search.answer, search.answer.value
            run = have.get((search.rep.name, value))
            if run is None or run.path is None or (run.status != 0 and not allow_incomplete):
                why = refused.get((search.rep.name, value)) or (
                    f"the capture at {knob} = {value} ended with exit status {run.status if run else '?'}")
                answer.confirmed = False
                answer.confirm_note = ((answer.confirm_note + "; ") if answer.confirm_note else "") + (
                    f"not confirmed: {why}")
                continue
            if run.path not in loaded:
                from .scale import load_input

                loaded[run.path] = load_input(run.path, Fraction(run.value))
            summary = simulate_trace(loaded[run.path].trace, "pytorch", search.params,
                                     capacity=Capacity(search.capacity, GIVEN), fast=True).summary
            est = search.estimate(int(summary["peak_reserved_bytes"]))
            predicted = (answer.estimate or {}).get("total_bytes", 0)
            if summary["verdict"]["fits"] and est.get("fits") is True:
                answer.confirmed = True
                answer.confirm_note = ((answer.confirm_note + "; ") if answer.confirm_note else "") + (
                    f"confirmed: captured at {knob} = {value}, it needs {format_bytes(est['total_bytes'])} "
                    f"(predicted {format_bytes(predicted)})")
                continue
            verdict = summary["verdict"]
            shown = (f"needs {format_bytes(est['total_bytes'])}" if verdict["fits"] else
                     f"does not fit ({verdict['line'][:160]})")
            missed = (f"a capture at {knob} = {value} {shown}, not the predicted {format_bytes(predicted)}: a kernel "
                      "that switches past the values captured")
            answer.confirmed = False
            answer.confirm_note = missed
            if round_ + 1 == CONFIRM_ROUNDS:
                answer.confirm_note += f"; not confirmed: the answer is below {value}, give --values near it"
                continue
            try:
                choice, _ = _choose_inputs([*search.choice.runs, run], loaded, scale_name, knob, True)
            except MixedInputs as exc:
                answer.confirm_note += (f"; not confirmed: with that capture the inputs are not one configuration "
                                        f"({exc.differences[0].text if exc.differences else exc}): the answer is "
                                        f"below {value}, give --values near it")
                continue
            search.choice = choice
            search.run(knob, multiple, value - multiple if value > multiple else value, advise, executor)
            again = search.answer
            if again.value is not None and again.at_limit and again.value + multiple == value:
                # the search stopped below the capture that did not fit: that capture is its first failure
                again.at_limit, again.first_failing, again.why_not = False, value, verdict["line"]
            again.confirm_note = missed + f"; searched again with it: {knob} = {again.value}"
            if search.answer.value is not None:
                still.append(search)
        todo = still
    return made


def fit(command: Sequence[str], gpus: Sequence[str] | None = None, *, values: Sequence[int] = DEFAULT_VALUES,
        steps: int = DEFAULT_STEPS, out_dir: str | None = None, scale_name: str | None = None, multiple: int = 1,
        max_value: int | None = None, advise: bool = True, workers: int | None = None,
        timeout_s: float | None = None, per_gpu: bool = False, extra_captures: int = MAX_EXTRA_CAPTURES,
        allow_incomplete: bool = False, confirm: bool = True, target_torch: str | None = None,
        log: Callable[[str], None] = lambda message: None) -> FitResult:
    """Capture, scale and search (module doc); ``ValueError`` / ``AllocsimError`` on bad input,
    ``ScriptFailed`` when a capture did not finish (``allow_incomplete``: when it wrote no trace; the
    answers then say they come from captures that stop early). Every argument is checked before the
    first capture. A launcher command (``torchrun ...``) is ``fit_ranks.fit_job``'s.

    Where two captures disagree (a kernel switch between them), up to ``extra_captures`` more are
    made at twice the largest value, and the laws come from the largest ones that agree (``_choose_inputs``).
    With ``confirm``, each answer is then captured and replayed (``_confirm``): a kernel that switches
    past the values captured shows there, and the search is made again with that capture.

    The captures run in the interpreter ``command`` names (``python``, or the training environment's
    ``/path/to/venv/bin/python``), so they follow its torch; ``target_torch`` is the torch the GPU run
    uses when it is not that one (the answer's ``torch`` note says so).
    """
    from .torch_release import check_target, inputs_check
    from .scale import load_input
    from .scale.consistency import MixedInputs
    from .sweep.executors import make_executor
    from .gpu_ranges import is_capture, runs_cudnn
    from .trace.inference.workspaces import cublas_workspaces_in_trace

    command = list(command)
    target_torch = check_target(target_torch)
    values = sorted(set(int(v) for v in values))
    if len(values) < 2 or values[0] < 1 or values[-1] > MAX_VALUE:
        raise ValueError(f"give two or more different values from 1 to {MAX_VALUE:,} to capture, e.g. --values 4,8")
    if steps < 0:
        raise ValueError(f"--steps must be >= 0, got {steps}")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"--timeout must be a number of seconds > 0, got {timeout_s}")
    if extra_captures < 0:
        raise ValueError(f"extra captures must be >= 0, got {extra_captures}")
    knob = check_command(command, values)
    # a value whose script does not exist (``cfg{B}.py`` with no cfg8.py) is never an extra capture
    extras = [v for v in extra_values(values, extra_captures) if _runs_at(command, knob, v)]
    possible = [*values, *extras]
    check_search(values, multiple, max_value)
    models = [find_gpu(name) for name in (gpus or DEFAULT_GPUS)]
    models = list({m.name: m for m in models}.values())           # a card asked twice is answered once
    scale_name = scale_name or scale_name_for(knob)
    groups = group_gpus(models, per_gpu)
    reps = [rep for rep, _ in groups]
    if out_dir is not None:
        from .output_file import check_output_folder, make_output_folder

        check_output_folder(out_dir)
        if os.path.isdir(out_dir):
            check_capture_paths([capture_paths(command, knob, v, rep, out_dir) for rep in reps for v in possible])
        make_output_folder(out_dir)
        folder = out_dir
    else:
        folder = tempfile.mkdtemp(prefix="allocsim-fit-")
    n_workers = workers or os.cpu_count() or 1
    try:
        t0 = time.monotonic()
        captures = capture_all(command, knob, values, reps, folder, steps, timeout_s, n_workers, out_dir is not None,
                               log, allow_incomplete)
        loaded: dict[str, Any] = {}
        choices: dict[str, InputsChoice] = {}
        pending = list(reps)
        disagreed: dict[str, str] = {}
        while pending:
            final = not extras
            for rep in list(pending):
                mine = [c for c in captures if c.gpu == rep.name]
                for c in mine:
                    if c.path not in loaded:
                        loaded[c.path] = load_input(c.path, Fraction(c.value))
                try:
                    choice, why = _choose_inputs(mine, loaded, scale_name, knob, final)
                except MixedInputs as exc:
                    raise _refused(exc, mine, knob) from None
                if why and rep.name not in disagreed:
                    disagreed[rep.name] = why
                if choice is not None:
                    added = [c.value for c in mine if c.value not in values]
                    if added and not choice.note:
                        choice.note = (f"the captures at {knob} = {', '.join(map(str, values))} disagree "
                                       f"({disagreed.get(rep.name, 'a kernel switch')}): {knob} = "
                                       f"{', '.join(map(str, added))} captured too; the laws fit {knob} = "
                                       f"{', '.join(str(c.value) for c in choice.runs)}, which agree")
                    choices[rep.name] = choice
                    pending.remove(rep)
            if pending:
                value = extras.pop(0)
                reasons = "; ".join(f"{r.name}: {disagreed.get(r.name) or 'they differ'}" for r in pending)
                log(f"the captures disagree, a kernel switch between them? ({reasons}): capturing {knob} = {value} "
                    "too")
                captures += capture_all(command, knob, [value], pending, folder, steps, timeout_s, n_workers,
                                        out_dir is not None, log, allow_incomplete)
        t1 = time.monotonic()
        confirm_values: list[int] = []
        searches: list[_Search] = []
        incomplete = ""
        torch = {}
        executor = make_executor(workers=workers) if advise else None
        with executor if executor is not None else contextlib.nullcontext():
            for rep, members in groups:
                choice = choices[rep.name]
                inputs = [loaded[c.path] for c in choice.runs]
                torch = torch or inputs_check([item.trace.meta for item in inputs], target_torch)
                incomplete = incomplete or choice.scaler.incomplete
                in_trace = all(cublas_workspaces_in_trace(item.trace.meta) for item in inputs)
                cudnn = any(runs_cudnn(item.trace) for item in inputs)
                capture = all(is_capture(item.trace) for item in inputs)
                for gpu in members:
                    log(f"searching the largest {knob} that fits {gpu.name}")
                    # FITS only at the high end of the unknown terms (gpu_ranges); the point's answer after
                    search = _Search(gpu, rep, choice, allocator_capacity(gpu, in_trace, end="high", cudnn=cudnn,
                                                                          capture=capture), in_trace, cudnn, capture,
                                     allocator_capacity(gpu, in_trace, end="point", cudnn=cudnn, capture=capture))
                    search.run(knob, multiple, max_value, advise, executor)
                    searches.append(search)
            if confirm:
                confirming = _confirm(searches, command, knob, folder, steps, timeout_s, n_workers, out_dir,
                                      allow_incomplete, loaded, scale_name, multiple, advise, executor, log)
                confirm_values = sorted({c.value for c in confirming} - {c.value for c in captures})
                captures += confirming
        answers = [search.answer for search in searches]
        replay = [shlex.join(["allocsim", "scale", *(f"{c.path}@{c.value}" for c in search.choice.runs),
                              "--name", scale_name, "--gpu", search.gpu.name, "--find-max",
                              *(["--multiple-of", str(multiple)] if multiple != 1 else []),
                              *(["--max-value", str(max_value)] if max_value else [])]) for search in searches]
        t2 = time.monotonic()
    finally:
        if out_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    if out_dir is None:               # nothing to point at any more
        captures = [dataclasses.replace(c, path=None, log=None) for c in captures]
        replay = []
    order = {m.name: i for i, m in enumerate(models)}
    answers.sort(key=lambda a: order[a.gpu.name])
    captured = sorted({c.value for c in captures})
    return FitResult(command, knob, scale_name, captured, steps, captures, answers, t1 - t0, t2 - t1,
                     out_dir, replay, incomplete, torch, confirm_values)


__all__ = ["DEFAULT_GPUS", "DEFAULT_STEPS", "DEFAULT_VALUES", "FitResult", "GpuAnswer", "MAX_EXTRA_CAPTURES",
           "ScriptFailed", "capture_class", "check_command", "check_search", "extra_values", "fit", "group_gpus",
           "knob_of", "parse_values", "scale_name_for", "value_range", "with_value"]
