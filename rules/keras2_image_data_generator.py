from __future__ import annotations

import libcst as cst

from tfmigrate import tree
from tfmigrate.rule import Example, FixSafety, Import, Rule

_GENERATORS = frozenset(
    {
        "keras.preprocessing.image.ImageDataGenerator",
        "tensorflow.keras.preprocessing.image.ImageDataGenerator",
    }
)
# Arguments that do nothing at these values (ImageDataGenerator's defaults).
_OFF = {
    "featurewise_center": False,
    "samplewise_center": False,
    "featurewise_std_normalization": False,
    "samplewise_std_normalization": False,
    "zca_whitening": False,
    "rotation_range": 0,
    "width_shift_range": 0,
    "height_shift_range": 0,
    "shear_range": 0,
    "zoom_range": 0,
    "channel_shift_range": 0,
    "horizontal_flip": False,
    "vertical_flip": False,
}
_SHIFTS = ("height_shift_range", "width_shift_range")
_FLIPS = {"horizontal_flip": "horizontal", "vertical_flip": "vertical"}


def _literal(node: cst.BaseExpression) -> object:
    """A number or boolean literal's value (a unary minus included); ``...`` otherwise."""
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    if isinstance(node, cst.Integer | cst.Float):
        return node.evaluated_value
    return ...


def _layers(call: cst.Call) -> list[str] | None:
    """The Keras 3 preprocessing layers doing what the generator's arguments ask, or None when
    an argument has no such layer here (featurewise statistics, shear, zoom, ...)."""
    given: dict[str, cst.BaseExpression] = {}
    for arg in call.args:
        if arg.keyword is None:
            return None
        given[arg.keyword.value] = arg.value
    fill = "nearest"  # ImageDataGenerator's default; the layers' is "reflect"
    if "fill_mode" in given:
        mode = given.pop("fill_mode")
        if not isinstance(mode, cst.SimpleString):
            return None
        fill = str(mode.evaluated_value)
    code = cst.Module([]).code_for_node
    active = {}
    for name, value in given.items():
        if name not in _OFF:
            return None
        literal = _literal(value)
        if literal is ... and name not in _SHIFTS:
            return None
        if literal is ... or literal != _OFF[name]:
            active[name] = value
    if set(active) - {*_SHIFTS, *_FLIPS}:
        return None
    layers = []
    if any(s in active for s in _SHIFTS):
        height, width = (code(active[s]) if s in active else "0.0" for s in _SHIFTS)
        for s in _SHIFTS:
            literal = _literal(active[s]) if s in active else 0.0
            if literal is not ... and not (isinstance(literal, float) and 0 < literal < 1):
                return None  # ints are pixels to ImageDataGenerator; factors to the layer
        layers.append(f"keras.layers.RandomTranslation({height}, {width}, fill_mode={fill!r})")
    flips = [mode for name, mode in _FLIPS.items() if name in active]
    if flips:
        layers.append(f"keras.layers.RandomFlip({'_and_'.join(flips)!r})")
    return layers


def _flow_args(call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression, str] | None:
    """``gen.flow(x, y, batch_size=n)``: x, y and the batch size (32 by default)."""
    positional = [a.value for a in call.args if a.keyword is None]
    named = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if len(positional) != 2 or set(named) - {"batch_size"}:
        return None
    batch = named.get("batch_size")
    return positional[0], positional[1], cst.Module([]).code_for_node(batch) if batch else "32"


class Keras2ImageDataGenerator(Rule):
    """
    ## What it does
    Converts Keras 2's `ImageDataGenerator` where it only shifts and flips images, fed to `fit`
    through `flow(x, y, batch_size=...)`: the augmentation becomes Keras 3 preprocessing layers
    (`RandomTranslation`, `RandomFlip`) mapped over a `tf.data` pipeline of the same arrays,
    shuffled and batched as `flow` did. Other uses are reported.

    ## Why is this bad?
    Keras 3 has no `ImageDataGenerator`: `from keras.preprocessing.image import
    ImageDataGenerator` raises ImportError, and the program stops at its first line.

    ## Example
    ```python
    import keras
    from keras.preprocessing.image import ImageDataGenerator
    datagen = ImageDataGenerator(width_shift_range=0.1, height_shift_range=0.1, horizontal_flip=True)
    datagen.fit(x_train)
    model.fit(datagen.flow(x_train, y_train, batch_size=64), epochs=2)
    ```
    Use instead:
    ```python
    import keras
    import tensorflow as tf

    datagen = keras.Sequential([
        keras.layers.RandomTranslation(0.1, 0.1, fill_mode='nearest'),
        keras.layers.RandomFlip('horizontal'),
    ])
    augmented_batches = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train)).batch(64).repeat()
        .map(lambda images, labels: (datagen(images, training=True), labels))
    )
    model.fit(augmented_batches, epochs=2)
    ```

    ## Fix safety
    Unsafe: the same kinds of random shifts (a uniform fraction of the height and width, the
    edge pixels repeated) and flips, drawn by another generator, so the augmented images differ;
    `datagen.fit(x)` computed nothing for these arguments and goes. A `fit` over the repeated
    pipeline needs `steps_per_epoch`, as it did over the endless `flow`.
    """

    code = "TFM117"
    triggers = ("ImageDataGenerator",)
    name = "keras2-image-data-generator"
    summary = "Keras 2 ImageDataGenerator (gone in Keras 3): preprocessing layers over tf.data"
    fix_safety = FixSafety.UNSAFE

    valid = (
        "import keras\naugment = keras.layers.RandomFlip('horizontal')\n",
        # tf_keras still has it
        "from tf_keras.preprocessing.image import ImageDataGenerator\n"
        "gen = ImageDataGenerator(horizontal_flip=True)\n",
    )
    invalid = (
        Example(
            """
            import keras
            from keras.preprocessing.image import ImageDataGenerator
            datagen = ImageDataGenerator(width_shift_range=0.1, height_shift_range=0.1, horizontal_flip=True)
            datagen.fit(x_train)
            model.fit(datagen.flow(x_train, y_train, batch_size=64), epochs=2)
            """,
            fixed="""
            import keras
            import tensorflow as tf

            datagen = keras.Sequential([
                keras.layers.RandomTranslation(0.1, 0.1, fill_mode='nearest'),
                keras.layers.RandomFlip('horizontal'),
            ])
            augmented_batches = (
                tf.data.Dataset.from_tensor_slices((x_train, y_train))
                .shuffle(len(x_train)).batch(64).repeat()
                .map(lambda images, labels: (datagen(images, training=True), labels))
            )
            model.fit(augmented_batches, epochs=2)
            """,
            message="Keras 3 has no `ImageDataGenerator`",
        ),
        # zoom has no exact layer here: reported, not rewritten
        Example(
            """
            from keras.preprocessing.image import ImageDataGenerator
            gen = ImageDataGenerator(zoom_range=0.2)
            model.fit(gen.flow(x, y), epochs=1)
            """,
            message="reported only",
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        for statement in tree.walk(original_node):
            if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
                continue
            target, call = statement.targets[0].target, statement.value
            if not (
                isinstance(target, cst.Name)
                and isinstance(call, cst.Call)
                and self.call_name(call) in _GENERATORS
            ):
                continue
            self._convert(original_node, target.value, statement, call)

    def _convert(self, module: cst.Module, name: str, assign: cst.Assign, call: cst.Call) -> None:
        layers = _layers(call)
        fits: list[cst.SimpleStatementLine] = []
        flows: list[tuple[cst.Call, tuple[cst.BaseExpression, cst.BaseExpression, str]]] = []
        other = False
        for node in tree.walk(module):
            if (
                not isinstance(node, cst.Name)
                or node.value != name
                or node is assign.targets[0].target
            ):
                continue
            attribute = self.parent(node)
            use = self.parent(attribute) if isinstance(attribute, cst.Attribute) else None
            method = attribute.attr.value if isinstance(attribute, cst.Attribute) else None
            expression = self.parent(use) if isinstance(use, cst.Call) else None
            line = self.parent(expression) if isinstance(expression, cst.Expr) else None
            if (
                method == "fit"
                and isinstance(line, cst.SimpleStatementLine)
                and len(line.body) == 1
            ):
                fits.append(line)
            elif method == "flow" and isinstance(use, cst.Call) and _flow_args(use) is not None:
                args = _flow_args(use)
                assert args is not None
                flows.append((use, args))
            else:
                other = True
        what = (
            f"`{name} = ImageDataGenerator(...)`: Keras 3 has no `ImageDataGenerator` (ImportError "
            "at start-up)"
        )
        # Keras 2's fit_generator around a flow is made `fit` first (TFM112): the flow's
        # rewrite inside it would be lost under that fix
        pending = any(
            isinstance(a, cst.Call)
            and isinstance(a.func, cst.Attribute)
            and a.func.attr.value == "fit_generator"
            for flow, _ in flows
            for a in self.ancestors(flow)
        )
        if pending:
            self.report(call, what + "; converted once `fit_generator` is `fit` (TFM112)")
            return
        if layers is None or other or not flows:
            self.report(
                call,
                what + "; reported only: augment with Keras preprocessing layers (or "
                "tf.image) in a tf.data pipeline",
            )
            return
        imports = (Import("keras"), Import("tensorflow", asname="tf"))
        line = self.enclosing_statement(assign)
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            self.report(call, what + "; reported only: the assignment shares its line")
            return
        listed = "".join(f"    {layer},\n" for layer in layers)
        self.report(
            call,
            what + ": the same shifts and flips as Keras preprocessing layers, mapped over a "
            "tf.data pipeline of the arrays `flow` batched",
            # the argument comments described the generator's arguments: the line is new
            replacement=cst.parse_statement(
                f"{name} = keras.Sequential([\n{listed}])\n"
            ).with_changes(leading_lines=line.leading_lines),
            target=line,
            imports=imports,
        )
        code = module.code_for_node
        for number, (flow, (x, y, batch)) in enumerate(flows):
            statement = self.enclosing_statement(flow)
            if not isinstance(statement, cst.SimpleStatementLine):
                self.report(flow, f"`{name}.flow(...)`: reported only (not in a simple statement)")
                continue
            batches = "augmented_batches" + (f"_{number + 1}" if number else "")
            pipeline = cst.parse_statement(
                f"{batches} = (\n"
                f"    tf.data.Dataset.from_tensor_slices(({code(x)}, {code(y)}))\n"
                f"    .shuffle(len({code(x)})).batch({batch}).repeat()\n"
                f"    .map(lambda images, labels: ({name}(images, training=True), labels))\n"
                ")\n"
            )
            pipeline = pipeline.with_changes(leading_lines=statement.leading_lines)
            reading = cst.ensure_type(statement.deep_replace(flow, cst.Name(batches)),
                                      cst.SimpleStatementLine).with_changes(leading_lines=[])  # fmt: skip
            self.report(
                flow,
                f"`{name}.flow(...)`: a tf.data pipeline, shuffled and batched as `flow` did",
                replacement=cst.FlattenSentinel([pipeline, reading]),
                target=statement,
                imports=imports,
            )
        for statement in module.body:
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                continue
            small = statement.body[0]
            if (
                isinstance(small, cst.ImportFrom)
                and not isinstance(small.names, cst.ImportStar)
                and len(small.names) == 1
                and small.names[0].asname is None
                and code(small.names[0].name) == "ImageDataGenerator"
            ):
                self.report(small, "nothing uses the import now: removed",
                            replacement=cst.RemovalSentinel.REMOVE, target=statement)  # fmt: skip
        for line in fits:
            self.report(
                line,
                f"`{name}.fit(...)` computes featurewise statistics, which these arguments do "
                "not use: removed",
                replacement=cst.RemovalSentinel.REMOVE,
            )
