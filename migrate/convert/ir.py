"""The typed reading of one TF1 multi-GPU training program: what the later plan and emit stages
consume. Every part says where it was read (file and line), so a plan can point at the code."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Where:
    """A place in the project: a POSIX path relative to the project root and a 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Towers:
    """The per-device replication: the loop (or comprehension) at ``where`` inside
    ``function``; ``body`` is the per-tower function it calls when ``tf.device`` sits there
    (else None: the loop body is the tower); ``devices`` is the ``tf.device`` argument as
    written and ``count`` what the loop iterates over."""

    where: Where
    function: str
    body: str | None
    devices: str
    count: str


@dataclass(frozen=True)
class Loss:
    """The per-replica loss: the expression each tower (or Horovod process) differentiates."""

    where: Where
    expression: str


class CombineKind(Enum):
    """How the towers' contributions become one update."""

    AVERAGED = "averaged gradients"
    SUMMED = "summed gradients"
    COLOCATED_LOSS = "one loss over the towers (colocate_gradients_with_ops)"
    HOROVOD = "Horovod allreduce"
    MERGED_OUTPUTS = "one loss over the merged outputs (Keras multi_gpu_model)"


@dataclass(frozen=True)
class Combination:
    """How the gradients (or losses) of the replicas are combined. ``spelling`` is how the
    program writes it: a helper's name, ``inline``, ``python-sum (IndexedSlices)``,
    ``reduce_mean over a list``, ``add_n / len``, ``DistributedOptimizer``, ``allreduce``..."""

    kind: CombineKind
    spelling: str
    where: Where


class UpdateKind(Enum):
    """How the weights change: an optimizer's apply_gradients or minimize, or assignments the
    program writes itself."""

    APPLY_GRADIENTS = "apply_gradients"
    MINIMIZE = "minimize"
    HAND_WRITTEN = "hand-written update"
    KERAS_COMPILE = "compile/fit"


@dataclass(frozen=True)
class Update:
    """The step that changes the weights: ``optimizer`` is the optimizer's construction as
    written (``tf.train.AdamOptimizer(lr)``, a factory call) or the hand-written update
    function's name; ``optimizer_where`` is where it was built, when found."""

    kind: UpdateKind
    where: Where
    optimizer: str
    optimizer_where: Where | None = None


@dataclass(frozen=True)
class TowerCore:
    """One tower core: the replicated computation (None for Horovod's one-process-per-device
    step), its per-replica loss, how replicas are combined, and the update."""

    towers: Towers | None
    loss: Loss | None
    combination: Combination
    update: Update


class InputKind(Enum):
    """How the towers get their batches."""

    FEED_DICT = "feed_dict/placeholders"
    PER_GPU_PLACEHOLDERS = "per-GPU placeholders"
    QUEUE = "queue"
    PREFETCH_QUEUE = "prefetch_queue"
    PY_FUNC_SPLIT = "py_func split"
    ONE_SHOT = "tf.data one-shot"
    INITIALIZABLE = "tf.data initializable"
    REINITIALIZABLE = "tf.data reinitializable"
    STRING_HANDLE = "tf.data string_handle"
    DATASET = "tf.data (other)"
    KERAS_FIT = "arrays or a generator given to fit"


@dataclass(frozen=True)
class Input:
    """One way batches reach the towers; ``detail`` is the call or statement that says so."""

    kind: InputKind
    where: Where
    detail: str


class SessionKind(Enum):
    """What runs the graph."""

    SESSION = "tf.Session"
    SUPERVISOR = "Supervisor"
    MONITORED = "MonitoredTrainingSession"
    ESTIMATOR = "tf.estimator.Estimator"
    KERAS = "Keras fit"


@dataclass(frozen=True)
class Fetch:
    """A ``Session.run`` that runs the update: what it fetched, as written."""

    where: Where
    fetches: str


@dataclass(frozen=True)
class Loop:
    """The training loop: the ``for``/``while`` around the first step run, as written."""

    where: Where
    header: str


@dataclass(frozen=True)
class Session:
    """How the graph is run: the session's construction, the step runs found and the loop
    that repeats them."""

    kind: SessionKind
    where: Where
    steps: tuple[Fetch, ...] = ()
    loop: Loop | None = None


class SetUpKind(Enum):
    """The kinds of parts that run once around the loop."""

    INITIALIZER = "variables initializer"
    RESTORE = "checkpoint restore"
    SAVER = "saver"
    SUMMARIES = "summaries"
    QUEUE_RUNNERS = "queue runners"
    ITERATOR_INIT = "iterator initializer"
    BROADCAST = "Horovod broadcast"
    HOOKS = "session hooks"


@dataclass(frozen=True)
class SetUp:
    """A part that runs once around the training loop (initializers, restore, savers,
    summary writers, queue runners, Horovod's broadcast), as written."""

    kind: SetUpKind
    where: Where
    detail: str


@dataclass(frozen=True)
class DeviceConfig:
    """Session and device settings as written (``allow_soft_placement=True``,
    ``gpu_options.allow_growth = True``, ``visible_device_list``...)."""

    settings: tuple[str, ...]
    where: Where | None


@dataclass(frozen=True)
class Note:
    """Something a recognizer could not tell, with where and why."""

    where: Where
    text: str


@dataclass(frozen=True)
class Program:
    """One entry program: its tower cores, input, session (with its step runs and loop),
    device settings, the set-up parts found around the loop, and notes."""

    entry: str
    cores: tuple[TowerCore, ...]
    inputs: tuple[Input, ...]
    session: Session | None
    devices: DeviceConfig | None
    setup: tuple[SetUp, ...] = ()
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """Why a program could not be read: no tower core could be identified at ``file:line``."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"
