"""The soak's random plan: which collectives each step runs, how, and with
what input on every rank.

Why a plan drawn from one seed: every rank must make the same collective
calls (or the job hangs), and every rank must be able to compute every
result by itself. So all ranks draw the same plan from `seed`, and each
rank's input for a tensor comes from a generator seeded by (seed, step,
item, call, member, rank): any rank can regenerate any other rank's input
and compute the expected result with NumPy (benchmarks/soak/reference.py).

What varies and what is bounded. A long job must keep its memory only if
what it does repeats, so the plan repeats what TensorFlow caches for ever
and varies everything tfring has to handle afresh:

* Bounded: the collective *templates* (kind, dtype, op, scale factors,
  name, number of dimensions). TensorFlow keeps one eager kernel per
  distinct set of op attributes (about 34 KB each, for the life of the
  process) and one trace per tf.function input signature, so a template
  fixes every attribute. There is one single-call template per kind, dtype
  and op (every combination tfring supports), a few grouped templates
  (mixed dtypes), and a few tf.function programs of several calls.
* Varied every step: which templates run and on which lane (the main
  thread in plan order, or worker threads started in a rank-permuted
  order), shapes (zero-size and odd sizes; each template usually keeps one
  shape, the steady state tfring's response cache answers, and sometimes
  takes another, which invalidates the cached entry), per-rank first
  dimensions of allgather, alltoall splits, broadcast roots, the data.
* Names the core has never seen or has forgotten: "cold" names drawn in
  turn from a pool larger than tfring's response cache. The first lap
  over the pool brings new names; after that, every cold name has been
  evicted from the cache (more distinct names came since) and is
  negotiated again in full. Truly unique names on every step would measure
  TensorFlow's kernel cache, not tfring (see tfring/ops/collective_ops.py).
"""

import dataclasses
import math
import string

import numpy as np
import tensorflow as tf

REDUCE_DTYPES = ("uint8", "int8", "int32", "int64", "float16", "bfloat16",
                 "float32", "float64")
MOVE_DTYPES = REDUCE_DTYPES + ("uint16", "int16", "bool")
REDUCE_OPS = ("Sum", "Average", "Min", "Max", "Product")
SCATTER_OPS = ("Sum", "Average")
# Scale factors in use: exact and inexact in binary, above and below 1.
FLOAT_FACTORS = (0.5, 2.0, 0.1, 1.0 / 3.0)
INT_FACTORS = (2.0, 0.5, 3.0)

# Dimension sizes: zero, one, odd and even, a few larger.
DIMS = (0, 1, 2, 3, 4, 5, 7, 8, 13, 31, 64, 127)
DIM_WEIGHTS = (2, 6, 6, 6, 4, 5, 5, 3, 3, 2, 1, 1)
MAX_ELEMENTS = 4096  # an ordinary tensor; a "big" one is BIG_ELEMENTS
# Above TFRING_DIRECT_THRESHOLD (1 MiB) for 4-byte dtypes: reduced from its
# own buffer instead of through the fusion buffer.
BIG_ELEMENTS = 300_007
BIG_PROBABILITY = 0.03
USUAL_SHAPE_PROBABILITY = 0.7

MAX_THREAD_ITEMS = 4  # worker threads; every thread item gets its own
MAX_MAIN_ITEMS = 3
MAX_CALLS_PER_ITEM = 3
COLD_PROBABILITY = 0.35  # an eager call uses a cold name
COLD_POOL_MARGIN = 128  # cold names beyond the response cache's capacity

# Seed tags: the plan draws from independent streams.
_VOCABULARY, _STEP, _RANK_ORDER, _INPUT, _COLD, _PROGRAM_ORDER = range(6)


def np_dtype(dtype):
    """The NumPy dtype of a dtype name (bfloat16 from ml_dtypes)."""
    return np.dtype(tf.as_dtype(dtype).as_numpy_dtype)


def is_float(dtype):
    return dtype in ("float16", "bfloat16", "float32", "float64")


@dataclasses.dataclass(frozen=True)
class Collective:
    """What stays fixed for one tensor of a call: its kind, dtype, op and
    scale factors, number of dimensions and usual shape."""
    kind: str  # allreduce, allgather, broadcast, alltoall, reducescatter
    dtype: str
    usual_shape: tuple
    op: str = None  # allreduce and reducescatter
    prescale: float = 1.0
    postscale: float = 1.0
    even_split: bool = False  # alltoall: splits=None (dimension 0 / size)
    root: int = 0  # broadcast inside a tf.function (an attribute there)

    @property
    def ndim(self):
        return len(self.usual_shape)


@dataclasses.dataclass(frozen=True)
class CallTemplate:
    """One API call: a single collective or a grouped_* call of several."""
    api: str  # allreduce, grouped_allreduce, allgather, ...
    members: tuple  # of Collective
    name: str = None  # None: tfring's default naming
    cold: bool = False

    @property
    def grouped(self):
        return self.api.startswith("grouped_")

    @property
    def kind(self):
        return self.members[0].kind


@dataclasses.dataclass(frozen=True)
class ProgramTemplate:
    """A tf.function of several calls (its Python name names its tensors)."""
    name: str
    calls: tuple  # of CallTemplate


@dataclasses.dataclass(frozen=True)
class Use:
    """One tensor of one step: the shape on every rank, the broadcast root,
    the alltoall splits, and the key its inputs are generated from."""
    collective: Collective
    shapes: tuple  # one shape per rank
    key: tuple  # (step, item, call, member)
    root: int = 0
    # alltoall with splits: splits[r][k] rows go from rank r to rank k.
    splits: tuple = None


@dataclasses.dataclass(frozen=True)
class Call:
    template: CallTemplate
    uses: tuple  # one Use per member


@dataclasses.dataclass(frozen=True)
class Item:
    """What one lane runs: eager calls one after another, or one program."""
    index: int
    lane: str  # "main" (the main thread, plan order) or "thread"
    calls: tuple  # of Call
    program: ProgramTemplate = None  # None: eager

    @property
    def mode(self):
        return "eager" if self.program is None else "tf.function"


@dataclasses.dataclass(frozen=True)
class Step:
    index: int
    items: tuple  # main-lane items first, in plan order


def _rng(*key):
    return np.random.default_rng([int(k) for k in key])


class Plan:
    """The collectives of every step, the same on every rank.

    Build it with the seed, the number of ranks and tfring's response cache
    capacity; `step(i)` must be called for i = 0, 1, 2, ... in order (the
    cold names are handed out in turn).
    """

    def __init__(self, seed, size, cache_capacity):
        self.seed = seed
        self.size = size
        rng = _rng(seed, _VOCABULARY)
        self._names = set()
        self.singles = self._single_templates(rng)
        self.groups = self._group_templates(rng)
        self.programs = self._program_templates(rng)
        self.cold_pool_size = max(cache_capacity, 0) + COLD_POOL_MARGIN
        self._next_cold = 0
        self._next_step = 0
        # The step at which the last cold name was used for the first time.
        self.cold_first_lap_step = None

    # ---- the vocabulary, drawn once -------------------------------------

    def _fresh_name(self, rng):
        """A random tensor name, valid in graphs (`block/conv.kernel`)."""
        letters = list(string.ascii_lowercase)
        while True:
            parts = ["".join(rng.choice(letters, rng.integers(3, 8)))
                     for _ in range(rng.integers(1, 3))]
            name = "/".join(parts)
            if rng.random() < 0.4:
                name += rng.choice([".kernel", ".bias", "-0", "_grad", ".1"])
            if name not in self._names:
                self._names.add(name)
                return name

    def _shape(self, rng, ndim, min_ndim=0):
        """A random shape of `ndim` (at least `min_ndim`) dimensions with at
        most MAX_ELEMENTS elements."""
        ndim = max(ndim, min_ndim)
        weights = np.array(DIM_WEIGHTS, float) / sum(DIM_WEIGHTS)
        while True:
            shape = tuple(int(d) for d in rng.choice(DIMS, ndim, p=weights))
            if math.prod(shape) <= MAX_ELEMENTS:
                return shape

    def _collective(self, rng, kind, dtype, op=None, ndim=None):
        min_ndim = 1 if kind in ("alltoall", "reducescatter") else 0
        if ndim is None:
            ndim = int(rng.integers(min_ndim, 4))
        prescale = postscale = 1.0
        if kind in ("allreduce", "reducescatter") and rng.random() < 0.5:
            factors = FLOAT_FACTORS if is_float(dtype) else INT_FACTORS
            prescale = float(rng.choice((1.0,) + factors))
            postscale = float(rng.choice((1.0,) + factors))
        return Collective(kind=kind, dtype=dtype,
                          usual_shape=self._shape(rng, ndim, min_ndim), op=op,
                          prescale=prescale, postscale=postscale,
                          even_split=kind == "alltoall" and rng.random() < 0.3,
                          root=int(rng.integers(self.size)))

    def _maybe_name(self, rng, unnamed_probability):
        return None if rng.random() < unnamed_probability else \
            self._fresh_name(rng)

    def _single_templates(self, rng):
        """One template per kind, dtype and op: every supported
        combination."""
        templates = []
        for dtype in REDUCE_DTYPES:
            for op in REDUCE_OPS:
                templates.append(("allreduce", dtype, op))
            for op in SCATTER_OPS:
                templates.append(("reducescatter", dtype, op))
        for dtype in MOVE_DTYPES:
            for kind in ("allgather", "broadcast", "alltoall"):
                templates.append((kind, dtype, None))
        return [CallTemplate(api=kind,
                             members=(self._collective(rng, kind, dtype, op),),
                             name=self._maybe_name(rng, 0.25))
                for kind, dtype, op in templates]

    def _group(self, rng, api, count, name):
        """A grouped_* call of `count` tensors of mixed dtypes; the op and
        the scale factors are the call's, shared by every member."""
        kind = api[len("grouped_"):]
        dtypes = MOVE_DTYPES if kind == "allgather" else REDUCE_DTYPES
        op = None
        prescale = postscale = 1.0
        if kind != "allgather":
            op = str(rng.choice(REDUCE_OPS if kind == "allreduce" else
                                SCATTER_OPS))
            if rng.random() < 0.5:
                factors = (1.0,) + FLOAT_FACTORS + INT_FACTORS
                prescale = float(rng.choice(factors))
                postscale = float(rng.choice(factors))
        members = tuple(
            dataclasses.replace(self._collective(rng, kind,
                                                 str(rng.choice(dtypes))),
                                op=op, prescale=prescale, postscale=postscale)
            for _ in range(count))
        return CallTemplate(api=api, members=members, name=name)

    def _group_templates(self, rng):
        """grouped_* templates with mixed dtypes; grouped_reducescatter has
        no name argument (so it runs on the main lane only)."""
        groups = []
        for i in range(6):
            groups.append(self._group(rng, "grouped_allreduce",
                                      int(rng.integers(2, 6)),
                                      None if i < 2 else
                                      self._fresh_name(rng)))
        for i in range(4):
            groups.append(self._group(rng, "grouped_allgather",
                                      int(rng.integers(2, 5)),
                                      None if i < 1 else
                                      self._fresh_name(rng)))
        for _ in range(3):
            groups.append(self._group(rng, "grouped_reducescatter",
                                      int(rng.integers(2, 5)), None))
        return groups

    def _program_templates(self, rng):
        """tf.functions of 2-6 calls of any kind (named or not)."""
        programs = []
        for letter in "abcde":
            calls = []
            for _ in range(int(rng.integers(2, 7))):
                if rng.random() < 0.3:
                    api = str(rng.choice(["grouped_allreduce",
                                          "grouped_allgather",
                                          "grouped_reducescatter"]))
                    name = None if api == "grouped_reducescatter" else \
                        self._maybe_name(rng, 0.5)
                    calls.append(self._group(rng, api,
                                             int(rng.integers(2, 4)), name))
                else:
                    kind = str(rng.choice(["allreduce", "allgather",
                                           "broadcast", "alltoall",
                                           "reducescatter"]))
                    dtypes = REDUCE_DTYPES if kind in (
                        "allreduce", "reducescatter") else MOVE_DTYPES
                    op = None
                    if kind == "allreduce":
                        op = str(rng.choice(REDUCE_OPS))
                    elif kind == "reducescatter":
                        op = str(rng.choice(SCATTER_OPS))
                    calls.append(CallTemplate(
                        api=kind,
                        members=(self._collective(
                            rng, kind, str(rng.choice(dtypes)), op),),
                        name=self._maybe_name(rng, 0.5)))
            programs.append(ProgramTemplate(name=f"program_{letter}",
                                            calls=tuple(calls)))
        return programs

    def cold_template(self, index):
        """The fixed attributes of cold name `index` of the pool."""
        rng = _rng(self.seed, _COLD, index)
        kind = str(rng.choice(["allreduce", "allreduce", "allgather",
                               "broadcast"]))
        if kind == "allreduce":
            dtype, op = str(rng.choice(REDUCE_DTYPES)), str(
                rng.choice(REDUCE_OPS))
        else:
            dtype, op = str(rng.choice(MOVE_DTYPES)), None
        collective = Collective(kind=kind, dtype=dtype, op=op,
                                usual_shape=self._shape(rng,
                                                        int(rng.integers(4))),
                                root=int(rng.integers(self.size)))
        return CallTemplate(api=kind, members=(collective,),
                            name=f"cold.{index}", cold=True)

    # ---- one step --------------------------------------------------------

    def _use(self, rng, collective, key, fixed_attributes):
        """This step's shapes, root and splits for one tensor. With
        `fixed_attributes` (a program's tensors, whose root is traced into
        the graph, and a cold name's, which TensorFlow caches a kernel for
        per root) the broadcast root is the template's."""
        size = self.size
        usual = rng.random() < USUAL_SHAPE_PROBABILITY
        shape = collective.usual_shape if usual else self._shape(
            rng, collective.ndim)
        if (not fixed_attributes and collective.ndim == 1
                and collective.kind in ("allreduce", "reducescatter")
                and rng.random() < BIG_PROBABILITY):
            shape = (BIG_ELEMENTS,)
        rest = shape[1:]
        root = collective.root if fixed_attributes else int(
            rng.integers(size))
        splits = None
        if collective.kind == "allgather" and collective.ndim > 0:
            shapes = tuple((int(rng.integers(0, 10)),) + rest
                           for _ in range(size))
        elif collective.kind == "alltoall" and collective.even_split:
            shapes = tuple((size * int(rng.integers(0, 4)),) + rest
                           for _ in range(size))
        elif collective.kind == "alltoall":
            splits = tuple(tuple(int(x) for x in rng.integers(0, 4, size))
                           for _ in range(size))
            shapes = tuple((sum(row),) + rest for row in splits)
        else:
            shapes = (shape,) * size
        return Use(collective=collective, shapes=shapes, key=key, root=root,
                   splits=splits)

    def _call(self, rng, template, key, in_program=False):
        uses = tuple(self._use(rng, member, key + (m,),
                               in_program or template.cold)
                     for m, member in enumerate(template.members))
        return Call(template=template, uses=uses)

    def _take_cold(self, step):
        index = self._next_cold % self.cold_pool_size
        self._next_cold += 1
        if self._next_cold == self.cold_pool_size:
            self.cold_first_lap_step = step
        return self.cold_template(index)

    def step(self, index):
        """The items of step `index` (main lane first, in plan order)."""
        if index != self._next_step:
            raise ValueError(f"Plan.step({index}) called out of order; "
                             f"expected step {self._next_step}")
        self._next_step += 1
        rng = _rng(self.seed, _STEP, index)
        free_singles = list(range(len(self.singles)))
        free_groups = list(range(len(self.groups)))
        free_programs = list(range(len(self.programs)))
        rng.shuffle(free_singles)
        rng.shuffle(free_groups)
        rng.shuffle(free_programs)

        def eager_template(lane):
            """A template not yet used in this step that `lane` may run.
            Threads run named calls only: two calls in flight at once need
            distinct names (tfring pairs tensors by name)."""
            if rng.random() < COLD_PROBABILITY:
                return self._take_cold(index)
            pool, templates = ((free_groups, self.groups)
                               if rng.random() < 0.3 else
                               (free_singles, self.singles))
            for position, t in enumerate(pool):
                if lane == "main" or templates[t].name is not None:
                    return templates[pool.pop(position)]
            return self._take_cold(index)

        items = []
        lanes = (["main"] * int(rng.integers(1, MAX_MAIN_ITEMS + 1)) +
                 ["thread"] * int(rng.integers(1, MAX_THREAD_ITEMS + 1)))
        for item_index, lane in enumerate(lanes):
            if free_programs and rng.random() < 0.2:
                program = self.programs[free_programs.pop()]
                calls = tuple(self._call(rng, t, (index, item_index, c),
                                         in_program=True)
                              for c, t in enumerate(program.calls))
                items.append(Item(item_index, lane, calls, program))
                continue
            count = int(rng.integers(1, MAX_CALLS_PER_ITEM + 1))
            calls = tuple(self._call(rng, eager_template(lane),
                                     (index, item_index, c))
                          for c in range(count))
            items.append(Item(item_index, lane, calls))
        return Step(index=index, items=tuple(items))


def submission_order(seed, step, rank, count):
    """The order in which `rank` starts its `count` thread items at `step`
    (a different permutation on every rank and step)."""
    return [int(i) for i in _rng(seed, _RANK_ORDER, step, rank).permutation(
        count)]


def program_gate_order(seed, program_index, rank, count):
    """The order in which `rank` releases a program's `count` inputs (fixed
    per rank: the function is traced once per input signature)."""
    return [int(i) for i in _rng(seed, _PROGRAM_ORDER, program_index,
                                 rank).permutation(count)]


def jitter_seconds(seed, step, rank, item):
    """A short random delay before a thread item starts (0-0.3 ms)."""
    return float(_rng(seed, _RANK_ORDER, step, rank, item + 1).random()) * 3e-4


# ---- inputs ----------------------------------------------------------------

def _integer_bound(dtype, collective, size):
    """The largest |value| an integer input may have so that no reduction
    overflows (the scale factors and the number of ranks included)."""
    info = np.iinfo(np_dtype(dtype))
    pre = max(1.0, abs(collective.prescale))
    post = max(1.0, abs(collective.postscale))
    op = collective.op
    if collective.kind not in ("allreduce", "reducescatter"):
        return None  # data movement: any value
    if op == "Product":
        bound = (info.max / post) ** (1.0 / size) / pre
        return int(max(1, min(6, math.floor(bound))))
    if op in ("Min", "Max"):
        bound = info.max / (pre * post)
    else:  # Sum, Average
        bound = info.max / (size * pre * post)
    # Large int64 values check that all 64 bits survive; below 2**52 where
    # a factor sends them through double precision (exact there).
    limit = 2 ** 62 if (pre == 1 and post == 1) else 2 ** 52
    return int(max(1, min(limit, math.floor(bound * 0.99))))


def rank_input(seed, use, rank, size):
    """Rank `rank`'s input for `use`, as a NumPy array of the tensor's dtype.

    Values are chosen so that the reduction cannot overflow: integers are
    bounded by the dtype, the op, the factors and the number of ranks;
    Product inputs stay near 1 in magnitude.
    """
    collective = use.collective
    dtype = collective.dtype
    shape = use.shapes[rank]
    rng = _rng(seed, _INPUT, *use.key, rank)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    target = np_dtype(dtype)
    if is_float(dtype):
        if collective.op == "Product":
            magnitude = rng.uniform(0.5, 2.0, size=shape)
            values = magnitude * rng.choice([-1.0, 1.0], size=shape)
        elif collective.kind in ("allreduce", "reducescatter"):
            values = rng.standard_normal(shape) * 8.0
        else:
            values = rng.standard_normal(shape) * 100.0
        return np.asarray(values).astype(target)
    info = np.iinfo(target)
    bound = _integer_bound(dtype, collective, size)
    if bound is None:
        low, high = int(info.min), int(info.max)
    else:
        low, high = (0 if info.min == 0 else -bound), bound
    return rng.integers(low, high, size=shape, endpoint=True,
                        dtype=np.int64).astype(target)
