# Keras 2 -> Keras 3 changes that Horovod-era scripts meet on TensorFlow
# 2.16+ (where tf.keras is Keras 3):
#   model.compile(..., experimental_run_tf_function=False)  -> argument gone
#   opt.variables() / model.variables()                      -> .variables
#   keras.optimizers.SGD(lr=0.1)                             -> learning_rate=
#     (only where the name is imported from Keras or tf.keras: torch.optim's
#     optimizers take lr=, and other names are left alone)
#   keras.preprocessing.image.ImageDataGenerator -> tf.keras.preprocessing.
#     image.ImageDataGenerator (Keras 3 keeps it only in the tf.keras
#     namespace, as a legacy class that still feeds model.fit); the same
#     for `from keras.preprocessing import image` (then image.ImageDataGenerator)
# The fit / evaluate / predict calls are training_calls.py's.

from tfring.migrate._libcst import cst, m, metadata
from tfring.migrate.findings import dotted_name
from tfring.migrate.names import imported_names

REMOVED_COMPILE_ARGUMENTS = ("experimental_run_tf_function",)
# Where Keras 2 and 3 keep their optimizer classes, as imported.
KERAS_OPTIMIZER_MODULES = ("keras.optimizers", "tensorflow.keras.optimizers",
                           "tensorflow.optimizers", "tf_keras.optimizers")
IMAGE_MODULES = ("keras.preprocessing.image", "tensorflow.keras.preprocessing.image")
PREPROCESSING_PACKAGES = ("keras.preprocessing", "tensorflow.keras.preprocessing")


def is_keras_optimizer(name):
    """Whether an imported dotted name is a Keras optimizer class
    (tensorflow.keras.optimizers.SGD, keras.optimizers.legacy.Adam,
    tensorflow.compat.v1.keras.optimizers.RMSprop, ...)."""
    module, _, cls = name.rpartition(".")
    for compat in ("tensorflow.compat.v1.", "tensorflow.compat.v2."):
        if module.startswith(compat):
            module = "tensorflow." + module[len(compat):]
    for variant in (".legacy", ".experimental"):
        module = module.removesuffix(variant)
    return module in KERAS_OPTIMIZER_MODULES and cls[:1].isupper()


def _drop_trailing_comma(args):
    if args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return args


class Keras3(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (metadata.QualifiedNameProvider,)

    def __init__(self):
        super().__init__()
        self.needs_tensorflow_import = False

    def leave_Call(self, original, updated):
        func = updated.func
        if m.matches(func, m.Attribute(attr=m.Name("compile"))):
            args = [a for a in updated.args if not (
                a.keyword and a.keyword.value in REMOVED_COMPILE_ARGUMENTS)]
            if len(args) != len(updated.args):
                return updated.with_changes(args=_drop_trailing_comma(args))
        if (m.matches(func, m.Attribute(attr=m.Name("variables")))
                and not updated.args):
            return func
        if any(map(is_keras_optimizer, imported_names(self, original.func))):
            args = [a.with_changes(keyword=cst.Name("learning_rate"))
                    if a.keyword and a.keyword.value == "lr" else a
                    for a in updated.args]
            return updated.with_changes(args=args)
        return updated

    def leave_Attribute(self, original, updated):
        path = dotted_name(updated)
        if path == "keras.preprocessing.image.ImageDataGenerator":
            self.needs_tensorflow_import = True
            return cst.parse_expression(
                "tf.keras.preprocessing.image.ImageDataGenerator")
        return updated

    def leave_ImportFrom(self, original, updated):
        path = dotted_name(updated.module) if updated.module else None
        if (path in IMAGE_MODULES and not isinstance(updated.names, cst.ImportStar)
                and any(a.name.value == "ImageDataGenerator" for a in updated.names)):
            # tensorflow.keras.* resolves to Keras 3's tf.keras namespace.
            return updated.with_changes(module=cst.parse_expression(
                "tensorflow.keras.preprocessing.image"))
        if (path in PREPROCESSING_PACKAGES
                and not isinstance(updated.names, cst.ImportStar)
                and any(a.name.value == "image" for a in updated.names)):
            # `from keras.preprocessing import image`: Keras 3's
            # keras.preprocessing.image has no ImageDataGenerator.
            return updated.with_changes(module=cst.parse_expression(
                "tensorflow.keras.preprocessing"))
        return updated
