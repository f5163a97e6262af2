"""Which legacy checkpoint entry goes into which migrated variable (pure Python, no TensorFlow).

Inputs are descriptions: the checkpoint's names with shape and dtype, the program's variables with
shape and dtype, the manifest's mapping (legacy name -> migrated name) and the optimizer state the
program can take (legacy slot name -> migrated slot). Every problem is collected, by name, so one
run reports all of them; nothing is written when there is one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EMA_SUFFIX = "ExponentialMovingAverage"
# Name parts of TF1 optimizer state (slots and non-slot accumulators) when no optimizer tells us.
OPTIMIZER_HINTS = (
    "/Momentum",
    "/RMSProp",
    "/Adam",
    "/Adagrad",
    "/Ftrl",
    "/Adadelta",
    "/ProximalAdagrad",
)
OPTIMIZER_NAMES = ("beta1_power", "beta2_power")
# Keras 2 optimizers (tf_keras graph mode) keep theirs under `training/<class>/`.
KERAS2_OPTIMIZERS = ("SGD", "Adam", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Ftrl")


class ConversionError(Exception):
    """The conversion cannot be done; ``problems`` lists each by name. (Defined here, not in the
    boot module that runs as ``__main__``, so that every module raises the one class.)"""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


@dataclass(frozen=True)
class Spec:
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Assignment:
    source: str  # checkpoint name read
    target: str  # migrated variable name, or "<variable> [slot <name>]" for optimizer state
    legacy: str  # the legacy variable it stands for (== source unless an EMA shadow was loaded)
    kind: str  # "variable" | "ema" (shadow value loaded into the weight) | "slot"


@dataclass
class Plan:
    assignments: list[Assignment] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dropped_state: list[str] = field(default_factory=list)  # legacy optimizer state not converted

    @property
    def ok(self) -> bool:
        return not self.problems


def shadow_of(name: str, suffix: str = EMA_SUFFIX) -> str:
    """TF1 ExponentialMovingAverage.average_name: the variable's name + '/' + the EMA's name."""
    return f"{name}/{suffix}"


def is_shadow(name: str, suffix: str = EMA_SUFFIX) -> bool:
    return name.endswith("/" + suffix)


def is_optimizer_state(name: str) -> bool:
    last = name.rsplit("/", 1)[-1]
    parts = name.split("/")
    keras2 = len(parts) > 2 and parts[0] == "training" and parts[1] in KERAS2_OPTIMIZERS
    return keras2 or last in OPTIMIZER_NAMES or any(h in name for h in OPTIMIZER_HINTS)


def plan_conversion(
    checkpoint: dict[str, Spec],
    program: dict[str, Spec],
    mapping: dict[str, str],
    slots: dict[str, tuple[str, Spec]] | None = None,
    use_ema: bool = False,
    ema_suffix: str = EMA_SUFFIX,
    program_source: str = "the program has",
) -> Plan:
    """``slots``: legacy optimizer-state name -> (migrated slot label, its spec), for an optimizer
    whose state maps exactly (the same tf.compat.v1.train class on both sides).
    ``program_source`` says where the program's variables came from, for the problems."""
    plan = Plan()
    slots = slots or {}
    used: set[str] = set()
    shadows_loaded = 0
    for legacy, target in mapping.items():
        if legacy not in checkpoint:
            plan.problems.append(f"missing in the checkpoint: {legacy!r} (mapped to {target!r})")
            continue
        used.add(legacy)
        if target not in program:
            plan.problems.append(
                f"missing in the program: {target!r} (mapped from {legacy!r}) is not "
                f"among the variables {program_source}"
            )
            continue
        source, kind = legacy, "variable"
        if (
            use_ema
            and not is_shadow(legacy, ema_suffix)
            and shadow_of(legacy, ema_suffix) in checkpoint
        ):
            source, kind = shadow_of(legacy, ema_suffix), "ema"  # what TF1 evaluation code restored
            used.add(source)
            shadows_loaded += 1
        if _fits(plan, source, checkpoint[source], target, program[target]):
            plan.assignments.append(Assignment(source, target, legacy, kind))
    unmapped = sorted(set(program) - set(mapping.values()))
    for name in unmapped:
        plan.problems.append(
            f"missing in the mapping: the program's variable {name!r} has no legacy "
            "counterpart (it would keep its fresh initial value)"
        )
    if use_ema and not shadows_loaded:
        plan.problems.append(
            f"--use-ema: the checkpoint holds no '{ema_suffix}' shadow of any mapped variable"
        )

    missing_state = []
    for legacy, (target, spec) in slots.items():
        if legacy not in checkpoint:
            missing_state.append(legacy)
            continue
        used.add(legacy)
        if _fits(plan, legacy, checkpoint[legacy], target, spec):
            plan.assignments.append(Assignment(legacy, target, legacy, "slot"))
    if missing_state:
        plan.notes.append(
            f"optimizer state not in the checkpoint, starts fresh: {', '.join(missing_state)}"
        )

    dropped_state, dropped_shadows, dropped_steps, unknown = [], [], [], []
    for name in sorted(set(checkpoint) - used):
        if is_optimizer_state(name):
            dropped_state.append(name)
        elif is_shadow(name, ema_suffix):
            dropped_shadows.append(name)
        elif name.rsplit("/", 1)[-1] == "global_step":
            dropped_steps.append(name)
        else:
            unknown.append(name)
    for name in unknown:
        plan.problems.append(
            f"unknown name in the checkpoint: {name!r} is not in the mapping (map it in "
            "the manifest's 'variables', or check that the checkpoint belongs to this "
            "program)"
        )
    # global_step drives schedules and EMA warm-up: training state like the slots
    plan.dropped_state = dropped_state + dropped_steps
    if dropped_state:
        why = (
            "the program's optimizer state does not map exactly onto the legacy one's"
            if not slots
            else "no counterpart in the program's optimizer"
        )
        plan.notes.append(
            f"optimizer state dropped ({why}; it restarts from its initial values): "
            + ", ".join(dropped_state)
        )
    if dropped_shadows:
        plan.notes.append(
            "EMA shadows not converted (not mapped; --use-ema loads them into the weights): "
            + ", ".join(dropped_shadows)
        )
    if dropped_steps:
        plan.notes.append("not converted (not mapped): " + ", ".join(dropped_steps))
    return plan


def _fits(plan: Plan, source: str, have: Spec, target: str, want: Spec) -> bool:
    if have.shape != want.shape:
        plan.problems.append(
            f"shape mismatch: {source!r} is {list(have.shape)} in the checkpoint, "
            f"{target!r} is {list(want.shape)} in the program"
        )
        return False
    if have.dtype != want.dtype:
        plan.problems.append(
            f"dtype mismatch: {source!r} is {have.dtype} in the checkpoint, "
            f"{target!r} is {want.dtype} in the program"
        )
        return False
    return True
