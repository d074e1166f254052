# Keras 2 -> 3: the training-loop calls model.fit / evaluate / predict.
#
# Keras 3 dropped the *_generator methods and the data-loading arguments of
# the training calls (the queue and worker pool now belong to a
# keras.utils.PyDataset). Three rewrites, on any `.x(...)` call with these
# method names:
#   fit_generator / evaluate_generator / predict_generator -> fit / ...,
#     and their positional arguments after the data become keywords, since
#     the orders differ (evaluate_generator(gen, 10) passed steps=10;
#     evaluate(gen, 10) would pass y=10)
#   workers= / use_multiprocessing= / max_queue_size= are dropped from
#     fit / evaluate / predict and the *_generator calls (Keras 3 raises
#     TypeError or ValueError on them)

from tfring.migrate._libcst import cst

# Keras 2's positional order after the generator, per method.
GENERATOR_METHODS = {
    "fit_generator": ("fit", (
        "steps_per_epoch", "epochs", "verbose", "callbacks", "validation_data",
        "validation_steps", "validation_freq", "class_weight",
        "max_queue_size", "workers", "use_multiprocessing", "shuffle",
        "initial_epoch")),
    "evaluate_generator": ("evaluate", (
        "steps", "callbacks", "max_queue_size", "workers",
        "use_multiprocessing", "verbose")),
    "predict_generator": ("predict", (
        "steps", "callbacks", "max_queue_size", "workers",
        "use_multiprocessing", "verbose")),
}
TRAINING_METHODS = ("fit", "evaluate", "predict")
REMOVED_ARGUMENTS = ("workers", "use_multiprocessing", "max_queue_size")


def _positional_to_keywords(args, names):
    """The arguments after the first positional one get the keyword they
    had in the Keras 2 method; a starred argument stops the rewrite."""
    result = list(args[:1])
    for index, arg in enumerate(args[1:]):
        if arg.keyword is not None or arg.star or index >= len(names):
            result.extend(args[1 + index:])
            break
        result.append(arg.with_changes(
            keyword=cst.Name(names[index]),
            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                  whitespace_after=cst.SimpleWhitespace(""))))
    return result


def _without_removed_arguments(args):
    kept = [a for a in args
            if not (a.keyword and a.keyword.value in REMOVED_ARGUMENTS)]
    if len(kept) != len(args) and kept:
        # The last argument keeps the trailing comma and spacing the
        # removed one had, so multi-line calls stay tidy.
        kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
    return kept


class TrainingCalls(cst.CSTTransformer):

    def leave_Call(self, original, updated):
        func = updated.func
        if not isinstance(func, cst.Attribute):
            return updated
        method = func.attr.value
        args = list(updated.args)
        if method in GENERATOR_METHODS:
            new_method, positional_names = GENERATOR_METHODS[method]
            if args and args[0].keyword is None and not args[0].star:
                args = _positional_to_keywords(args, positional_names)
            func = func.with_changes(attr=cst.Name(new_method))
        elif method not in TRAINING_METHODS:
            return updated
        return updated.with_changes(func=func,
                                    args=_without_removed_arguments(args))
