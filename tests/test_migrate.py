# python -m tfring.migrate: each rewrite on its own, what it reports instead
# of porting, the command line, and whole scripts in the style of Horovod's
# TensorFlow 2 / Keras examples that must run at 2 ranks once ported.

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("libcst")

from tfring.migrate import migrate_source  # noqa: E402
from mpi_launch import launch, working_tree_env  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "migrate_fixtures"


def _port(source):
    return migrate_source(textwrap.dedent(source))


@pytest.mark.parametrize("before,after", [
    ("import horovod.tensorflow as hvd\n", "import tfring as hvd\n"),
    ("import horovod.tensorflow.keras as hvd\n", "import tfring.keras as hvd\n"),
    ("import horovod.keras as hvd\n", "import tfring.keras as hvd\n"),
    ("from horovod import tensorflow as hvd\n", "import tfring as hvd\n"),
    ("from horovod.tensorflow.keras.callbacks import MetricAverageCallback\n",
     "from tfring.keras.callbacks import MetricAverageCallback\n"),
    ("import horovod.tensorflow\nhorovod.tensorflow.init()\n",
     "import tfring\ntfring.init()\n"),
    ("import horovod\nhorovod.run(main, args=(1,), np=2)\n", "main(*(1,))\n"),
])
def test_horovod_imports(before, after):
    assert _port(before).source == after


@pytest.mark.parametrize("before,after", [
    ("import horovod.torch as hvd\n", "import tfring.torch as hvd\n"),
    ("import horovod.mxnet as hvd\n", "import tfring.mxnet as hvd\n"),
    ("from horovod.mxnet.mpi_ops import allreduce_\n",
     "from tfring.mxnet.mpi_ops import allreduce_\n"),
    ("from horovod import torch as hvd\n", "import tfring.torch as hvd\n"),
    ("from horovod.torch import DistributedOptimizer, broadcast_parameters\n",
     "from tfring.torch import DistributedOptimizer, broadcast_parameters\n"),
    ("from horovod.torch.mpi_ops import allreduce_async_\n",
     "from tfring.torch.mpi_ops import allreduce_async_\n"),
    ("import horovod.torch\nhorovod.torch.init()\n",
     "import tfring.torch\ntfring.torch.init()\n"),
    ("import horovod\nimport horovod.torch as hvd\n"
     "horovod.run(main, args=(args,), np=2, use_gloo=False)\n",
     "import tfring.torch as hvd\nmain(*(args,))\n"),
])
def test_horovod_torch_imports(before, after):
    result = _port(before)
    assert result.source == after
    assert result.findings == []


@pytest.mark.parametrize("source", [
    # torch.optim's keyword is lr: never renamed, however it is imported.
    "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.01)\n",
    "import torch.optim as optim\nopt = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)\n",
    "from torch import optim\nopt = optim.Adam(params, lr=1e-3)\n",
    "from torch.optim import SGD\nopt = SGD(params, lr=0.01)\n",
    "from torch.optim import AdamW as Adam\nopt = Adam(params, lr=0.01)\n",
    # A Keras-looking name that is not imported from Keras.
    "from mylib.optimizers import SGD\nopt = SGD(lr=0.1)\n",
    "def build(keras):\n    return keras.optimizers.SGD(lr=0.1)\n",
    # In a script that imports TensorFlow too, torch's optimizer stays.
    "import tensorflow as tf\nimport torch\nopt = torch.optim.SGD(p, lr=0.1)\n",
])
def test_lr_is_left_alone_on_optimizers_that_are_not_keras(source):
    assert _port(source).source == source


@pytest.mark.parametrize("imports,call", [
    ("import tensorflow as tf\n", "tf.keras.optimizers.SGD"),
    ("import tensorflow as tf\n", "tf.optimizers.Adam"),
    ("import tensorflow as tf\n", "tf.keras.optimizers.legacy.RMSprop"),
    ("import tensorflow as tf\n", "tf.compat.v1.keras.optimizers.Adam"),
    ("from tensorflow import keras\n", "keras.optimizers.Adadelta"),
    ("from tensorflow.keras import optimizers\n", "optimizers.Nadam"),
    ("from keras.optimizers import SGD\n", "SGD"),
    ("from tensorflow.keras.optimizers import Adam as KerasAdam\n", "KerasAdam"),
])
def test_lr_is_renamed_on_keras_optimizers_however_imported(imports, call):
    result = _port(f"{imports}opt = {call}(lr=0.1)\n")
    assert result.source == f"{imports}opt = {call}(learning_rate=0.1)\n"


@pytest.mark.parametrize("before,after", [
    ("import torch\nwith torch.cuda.amp.autocast():\n    y = m(x)\n",
     "import torch\nwith torch.amp.autocast(\"cuda\"):\n    y = m(x)\n"),
    # Positional arguments become keywords: torch.amp.autocast's order differs.
    ("import torch\nwith torch.cuda.amp.autocast(True, torch.float16):\n    pass\n",
     "import torch\nwith torch.amp.autocast(\"cuda\", enabled=True, dtype=torch.float16):\n"
     "    pass\n"),
    ("import torch\nwith torch.cpu.amp.autocast(dtype=torch.bfloat16):\n    pass\n",
     "import torch\nwith torch.amp.autocast(\"cpu\", dtype=torch.bfloat16):\n    pass\n"),
    ("import torch\nscaler = torch.cuda.amp.GradScaler(init_scale=1024)\n",
     "import torch\nscaler = torch.amp.GradScaler(\"cuda\", init_scale=1024)\n"),
    ("from torch.cuda.amp import autocast, GradScaler\n"
     "scaler = GradScaler()\n@autocast()\ndef f(x):\n    return x\n",
     "from torch.amp import autocast, GradScaler\n"
     "scaler = GradScaler(\"cuda\")\n@autocast(\"cuda\")\ndef f(x):\n    return x\n"),
    ("from torch.cuda.amp import autocast as ac\nwith ac(enabled=False):\n    pass\n",
     "from torch.amp import autocast as ac\nwith ac(\"cuda\", enabled=False):\n    pass\n"),
    # An import that also brings other names stays, and so do its calls.
    ("from torch.cuda.amp import autocast, custom_fwd\nwith autocast():\n    pass\n",
     "from torch.cuda.amp import autocast, custom_fwd\nwith autocast():\n    pass\n"),
    # Someone else's autocast is not torch's.
    ("from mylib import autocast\nwith autocast():\n    pass\nimport torch\n",
     "from mylib import autocast\nwith autocast():\n    pass\nimport torch\n"),
])
def test_torch_amp_rewrites(before, after):
    assert _port(before).source == after


@pytest.mark.parametrize("before,after", [
    ("import torch.nn.functional as F\nl = F.nll_loss(out, y, size_average=False).item()\n",
     "import torch.nn.functional as F\nl = F.nll_loss(out, y, reduction='sum').item()\n"),
    ("import torch.nn.functional as F\nl = F.cross_entropy(out, y, reduce=False)\n",
     "import torch.nn.functional as F\nl = F.cross_entropy(out, y, reduction='none')\n"),
    ("import torch.nn.functional as F\nl = F.mse_loss(a, b, size_average=True, reduce=True)\n",
     "import torch.nn.functional as F\nl = F.mse_loss(a, b, reduction='mean')\n"),
    # The legacy arguments win over reduction= in torch: the result keeps that.
    ("import torch\nc = torch.nn.NLLLoss(size_average=False, reduction='mean', weight=w)\n",
     "import torch\nc = torch.nn.NLLLoss(reduction='sum', weight=w)\n"),
    ("from torch import nn\nc = nn.L1Loss(\n    size_average=None,\n    reduce=False,\n)\n",
     "from torch import nn\nc = nn.L1Loss(\n    reduction='none',\n)\n"),
    # A value known only at run time is left for torch's warning.
    ("import torch.nn.functional as F\nl = F.nll_loss(o, y, size_average=flag)\n",
     "import torch.nn.functional as F\nl = F.nll_loss(o, y, size_average=flag)\n"),
    # Not torch's.
    ("import torch\nfrom mylib import nll_loss\nl = nll_loss(o, y, size_average=False)\n",
     "import torch\nfrom mylib import nll_loss\nl = nll_loss(o, y, size_average=False)\n"),
])
def test_torch_legacy_loss_reduction(before, after):
    assert _port(before).source == after


def test_removed_import_keeps_the_blank_lines_and_comments_above_it():
    result = _port("""\
        import os

        # Horovod
        import horovod
        import horovod.torch as hvd
        """)
    assert result.source == "import os\n\n# Horovod\nimport tfring.torch as hvd\n"


def test_a_pytorch_script_gets_no_keras_rewrites():
    # Calls that would get Keras 2 -> 3 edits in a Keras script.
    source = textwrap.dedent("""\
        import torch
        import horovod.torch as hvd
        trainer.fit(model, workers=4)
        names = layer.variables()
        model.compile(mode="max-autotune", experimental_run_tf_function=False)
        """)
    assert _port(source).source == source.replace("horovod.torch", "tfring.torch")


@pytest.mark.parametrize("before,after", [
    ("import horovod.torch as hvd\n\n@hvd.elastic.run\ndef train(state):\n    pass\n",
     "import tfring.torch as hvd\n\n@hvd.elastic.run\ndef train(state):\n    pass\n"),
    ("from horovod.torch.elastic import ElasticSampler\n",
     "from tfring.torch.elastic import ElasticSampler\n"),
    ("from horovod.torch import elastic\n", "from tfring.torch import elastic\n"),
    ("import horovod.tensorflow.keras as hvd\nstate = hvd.elastic.KerasState(model)\n",
     "import tfring.keras as hvd\nstate = hvd.elastic.KerasState(model)\n"),
    ("from horovod.tensorflow.elastic import TensorFlowKerasState\n",
     "from tfring.elastic import TensorFlowKerasState\n"),
])
def test_elastic_training_is_ported(before, after):
    result = _port(before)
    assert result.source == after
    assert not result.findings


@pytest.mark.parametrize("source,line,what,advice", [
    ("from horovod.spark import torch as hvd_spark\n",
     1, "uses Horovod's Spark integration", "tfringrun -np N"),
    ("import horovod.common.util as util\n", 1, "uses horovod.common",
     "horovod.torch and horovod.mxnet only"),
    ("from pytorch_lightning import Trainer\ntrainer = Trainer(accelerator='horovod', gpus=0)\n",
     2, "uses PyTorch Lightning's Horovod strategy", "strategy=\"ddp\""),
    ("import lightning as L\ntrainer = L.Trainer(strategy=\"horovod\")\n",
     2, "uses PyTorch Lightning's Horovod strategy", "tfring.torch.DistributedOptimizer"),
])
def test_what_cannot_be_ported_from_a_torch_script(source, line, what, advice):
    [finding] = _port(source).findings
    assert finding.line == line
    assert finding.what.startswith(what), finding
    assert advice in finding.suggestion, finding


@pytest.mark.parametrize("before,after", [
    ("model.compile(loss='mse', optimizer=opt, experimental_run_tf_function=False)\n",
     "model.compile(loss='mse', optimizer=opt)\n"),
    ("hvd.broadcast_variables(opt.variables(), root_rank=0)\n",
     "hvd.broadcast_variables(opt.variables, root_rank=0)\n"),
    ("import keras\nopt = keras.optimizers.SGD(lr=0.1, momentum=0.9)\n",
     "import keras\nopt = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)\n"),
    ("model.fit_generator(gen, epochs=2)\nmodel.evaluate_generator(gen)\n",
     "model.fit(gen, epochs=2)\nmodel.evaluate(gen)\n"),
    ("from keras.preprocessing.image import ImageDataGenerator\n",
     "from tensorflow.keras.preprocessing.image import ImageDataGenerator\n"),
    ("from keras.preprocessing import image\ng = image.ImageDataGenerator()\n",
     "from tensorflow.keras.preprocessing import image\ng = image.ImageDataGenerator()\n"),
    ("import tensorflow as tf\nimport keras\n"
     "g = keras.preprocessing.image.ImageDataGenerator()\n",
     "import tensorflow as tf\nimport keras\n"
     "g = tf.keras.preprocessing.image.ImageDataGenerator()\n"),
])
def test_keras3_rewrites(before, after):
    assert _port(before).source == after


@pytest.mark.parametrize("before,after", [
    # Keras 2's positional order differs from fit / evaluate / predict's.
    ("model.fit_generator(gen, 10, 2, verbose=0)\n",
     "model.fit(gen, steps_per_epoch=10, epochs=2, verbose=0)\n"),
    ("score = model.evaluate_generator(it, len(it), workers=4)\n",
     "score = model.evaluate(it, steps=len(it))\n"),
    ("p = model.predict_generator(it, 3)\n", "p = model.predict(it, steps=3)\n"),
    # Keras 3 has no worker / queue arguments on the training calls.
    ("model.fit(it,\n          workers=4,\n          epochs=1,\n"
     "          use_multiprocessing=True,\n          max_queue_size=10)\n",
     "model.fit(it,\n          epochs=1)\n"),
    ("model.evaluate(x, y, workers=2, verbose=0)\n",
     "model.evaluate(x, y, verbose=0)\n"),
    # Other calls are left alone.
    ("pool.map(f, xs, workers=4)\n", "pool.map(f, xs, workers=4)\n"),
])
def test_training_call_rewrites(before, after):
    assert _port(before).source == after


def test_keras3_rewrite_adds_the_tensorflow_import_it_needs():
    result = _port("import keras\ng = keras.preprocessing.image.ImageDataGenerator()\n")
    assert result.source.startswith("import keras\nimport tensorflow as tf\n")


def test_tensorflow_import_is_added_to_a_script_with_compound_statements():
    result = _port("""\
        import keras
        def build():
            return keras.preprocessing.image.ImageDataGenerator()
        """)
    assert result.source.startswith("import keras\nimport tensorflow as tf\n")
    assert "return tf.keras.preprocessing.image.ImageDataGenerator()" in result.source


def test_gpu_pinning_becomes_tf_config_and_keeps_comments():
    result = _port("""\
        import tensorflow as tf
        import horovod.keras as hvd
        # pin one GPU per process
        config = tf.ConfigProto()
        config.gpu_options.allow_growth = True
        config.gpu_options.visible_device_list = str(hvd.local_rank())
        tf.keras.backend.set_session(tf.Session(config=config))
        x = 1  # kept
        """)
    assert result.source == textwrap.dedent("""\
        import tensorflow as tf
        import tfring.keras as hvd
        # pin one GPU per process
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if gpus:
            tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
        x = 1  # kept
        """)
    assert result.findings == []


def test_tf1_eager_switch_goes_with_the_config_it_was_given():
    result = _port("""\
        import tensorflow as tf
        import horovod.tensorflow as hvd
        config = tf.ConfigProto()
        config.gpu_options.visible_device_list = str(hvd.local_rank())

        tf.enable_eager_execution(config=config)
        """)
    assert "enable_eager_execution" not in result.source
    assert "config" not in result.source.replace("tf.config", "")
    assert 'tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")' in result.source
    # Without a session config it is only dropped.
    alone = _port("import tensorflow as tf\ntf.compat.v1.enable_eager_execution()\nx = 1\n")
    assert alone.source == "import tensorflow as tf\nx = 1\n"


@pytest.mark.parametrize("use,what", [
    ("opt = tf.train.AdamOptimizer(0.001)", "a TF1 optimizer"),
    ("step = tf.compat.v1.train.get_or_create_global_step()", "a TF1 global step"),
    ("with tf.train.MonitoredTrainingSession() as s: pass",
     "a TF1 MonitoredTrainingSession"),
    ("tf.app.run()", "TF1's tf.app.run"),
    ("loss = tf.losses.sparse_softmax_cross_entropy(y, p)", "a TF1 loss function"),
])
def test_tf1_apis_are_listed(use, what):
    result = _port(f"import tensorflow as tf\n{use}\n")
    assert [(f.line, f.what.split(" (")[0]) for f in result.findings] == [(2, f"uses {what}")]
    assert "tf.GradientTape" in result.findings[0].suggestion


def test_what_cannot_be_ported_is_listed_with_its_line():
    result = _port("""\
        import tensorflow as tf
        import horovod.tensorflow.keras as hvd
        from horovod.spark.keras import KerasEstimator
        from horovod.ray import RayExecutor

        @hvd.elastic.run
        def train(state):
            pass

        sess = tf.compat.v1.Session()
        est = tf.estimator.Estimator(model_fn)
        """)
    found = {(f.line, f.what.split(" (")[0]) for f in result.findings}
    assert found == {
        (3, "uses Horovod's Spark integration"),
        (4, "uses Horovod's Ray integration"),
        (10, "uses a TF1 session"),
        (11, "uses tf.estimator.Estimator"),
    }, result.findings
    by_line = {f.line: f.suggestion for f in result.findings}
    assert "tfringrun -np N" in by_line[3]
    assert "tf.GradientTape" in by_line[10]
    assert "keras.Model" in by_line[11]
    # Those lines are left as they were; elastic training is ported.
    assert "@hvd.elastic.run" in result.source
    assert "from horovod.spark.keras import KerasEstimator" in result.source


def test_horovod_data_service_is_reported_and_left_alone():
    source = ("import horovod.tensorflow.keras as hvd\n"
              "from horovod.tensorflow.data.compute_service import TfDataServiceConfig\n")
    result = _port(source)
    assert result.source == ("import tfring.keras as hvd\n"
                             "from horovod.tensorflow.data.compute_service "
                             "import TfDataServiceConfig\n")
    [finding] = result.findings
    assert finding.line == 2
    assert finding.what.startswith("uses Horovod's tf.data compute service")
    assert "dataset.shard(tfring.size(), tfring.rank())" in finding.suggestion


def _run_tool(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tfring.migrate", *args],
                          capture_output=True, text=True, timeout=300,
                          env=working_tree_env(quiet_tensorflow=True), cwd=cwd)


def test_command_prints_a_diff_by_default_and_writes_with_write(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import horovod.tensorflow as hvd\nhvd.spark.run\n")
    shown = _run_tool(str(script))
    assert shown.returncode == 1, shown.stderr
    assert "-import horovod.tensorflow as hvd\n+import tfring as hvd" in shown.stdout
    assert f"cannot port: {script}:2: uses Horovod's Spark integration" in shown.stdout
    assert script.read_text().startswith("import horovod")  # not written
    written = _run_tool("--write", str(tmp_path))
    assert written.returncode == 1, written.stderr
    assert script.read_text() == "import tfring as hvd\nhvd.spark.run\n"


def test_write_skips_links_that_leave_the_tree(tmp_path):
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    foreign = outside / "shared.py"
    foreign.write_text("import horovod.torch as hvd\n")
    mine = tree / "train.py"
    mine.write_text("import horovod.torch as hvd\n")
    (tree / "a_link_out.py").symlink_to(foreign)
    (tree / "a_link_in.py").symlink_to(mine)  # sorts before its target
    result = _run_tool("--write", str(tree))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f"not ported: {tree / 'a_link_out.py'} is a symbolic link to {foreign}, "
            f"outside {tree}: name the file itself to port it") in result.stdout
    assert foreign.read_text() == "import horovod.torch as hvd\n"
    # A link inside the tree: its target is ported once, the link stays a link.
    assert mine.read_text() == "import tfring.torch as hvd\n"
    assert (tree / "a_link_in.py").is_symlink()
    assert result.stdout.count("ported ") == 1, result.stdout
    # Naming the file (or the link) on the command line ports it.
    named = _run_tool("--write", str(tree / "a_link_out.py"))
    assert named.returncode == 0, named.stdout + named.stderr
    assert foreign.read_text() == "import tfring.torch as hvd\n"
    assert (tree / "a_link_out.py").is_symlink()


def test_write_replaces_the_file_in_one_rename_and_keeps_its_mode(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import horovod.torch as hvd\r\nhvd.init()\r\n")
    script.chmod(0o750)
    before = script.stat()
    # A second name for the old file: an in-place rewrite would change it too.
    (tmp_path / "old_copy").hardlink_to(script)
    result = _run_tool("--write", str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    after = script.stat()
    assert after.st_ino != before.st_ino  # a new file renamed over the old one
    assert oct(after.st_mode & 0o7777) == oct(0o750)
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert (tmp_path / "old_copy").read_bytes() == b"import horovod.torch as hvd\r\nhvd.init()\r\n"
    assert script.read_bytes() == b"import tfring.torch as hvd\r\nhvd.init()\r\n"  # line endings kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old_copy", "train.py"]


def test_command_reports_a_file_that_does_not_parse(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("def (:\n")
    result = _run_tool(str(script))
    assert result.returncode == 2
    assert "does not parse as Python" in result.stderr


# The runs of each fixture, one argument list each (default: one run, no
# arguments). The MNIST-style torch script goes through its horovod.run
# branch, then resumes from the checkpoint the first run wrote.
FIXTURE_RUNS = {
    "torch_mnist_horovod.py": [["--num-proc", "2"],
                               ["--num-proc", "2", "--fp16-allreduce"]],
}


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.py")))
def test_ported_horovod_style_script_runs_at_two_ranks(fixture, tmp_path):
    if fixture.startswith("torch_"):
        pytest.importorskip("torch")
    script = tmp_path / fixture
    script.write_text((FIXTURES / fixture).read_text())
    ported = _run_tool("--write", str(script))
    assert ported.returncode == 0, ported.stdout + ported.stderr
    assert "import horovod" not in script.read_text()
    env = working_tree_env(quiet_tensorflow=True, OMP_NUM_THREADS="1",
                           TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="2")
    if fixture.startswith("torch_"):
        # What torch 2.x deprecated (torch.cuda.amp, size_average=) must be
        # gone: its warnings become errors.
        env["PYTHONWARNINGS"] = "error::FutureWarning,error:size_average:UserWarning"
    for run, arguments in enumerate(FIXTURE_RUNS.get(fixture, [[]])):
        result = launch([sys.executable, str(script), *arguments], 2,
                        timeout=300, env=env, cwd=str(tmp_path))
        assert result.returncode == 0 and not result.timed_out, result.describe()
        for rank in range(2):
            assert f"rank {rank} PORTED_SCRIPT_DONE" in result.output, result.describe()
        if run and fixture == "torch_mnist_horovod.py":
            assert "resumed=1" in result.output, result.describe()
