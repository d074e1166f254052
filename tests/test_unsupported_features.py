# Horovod features tfring does not provide fail with an error naming the
# feature and what to use instead, both as attributes and as imports.

import importlib
import sys

import pytest

import tfring
import tfring.keras


@pytest.mark.parametrize("feature,replacement", [
    ("spark", "tfringrun -np N"),
    ("ray", "tfringrun -np N"),
    ("run", "tfringrun -np N"),
    ("data", "dataset.shard(tfring.size(), tfring.rank())"),
])
def test_attribute_names_the_feature_and_the_replacement(feature, replacement):
    with pytest.raises(AttributeError) as raised:
        getattr(tfring, feature)
    message = str(raised.value)
    assert f"tfring.{feature} does not exist" in message
    assert "Horovod's" in message and replacement in message


def test_keras_spark_names_the_replacement():
    with pytest.raises(AttributeError, match=r"tfring\.keras\.spark does "
                       r"not exist: .*Spark integration"):
        tfring.keras.spark.KerasEstimator


@pytest.mark.parametrize("statement", [
    "import tfring.spark",
    "from tfring import spark",
    "import tfring.keras.ray",
    "from tfring.ray import RayExecutor",
    "from tfring.data.compute_service import TfDataServiceConfig",
])
def test_import_names_the_replacement(statement):
    with pytest.raises(ImportError, match=r"does not exist: tfring does not "
                       r"provide Horovod's .*Instead, "):
        exec(statement, {})


def test_other_missing_names_keep_the_usual_error():
    with pytest.raises(AttributeError,
                       match=r"module 'tfring' has no attribute 'no_such'"):
        tfring.no_such
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tfring.no_such_module")
    assert "tfring.spark" not in sys.modules
