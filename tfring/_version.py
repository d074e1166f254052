# tfring's release number, in one place: setup.py reads it for the package
# metadata and `tfring.__version__` / `tfringrun --check-build` report it.
__version__ = "0.1.0"
