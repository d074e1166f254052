"""Griffe extension: what tfring's package files re-export is public API.

Why: `tfring/__init__.py`, `tfring/keras/__init__.py`,
`tfring/keras/callbacks/__init__.py`, `tfring/torch/__init__.py` and
`tfring/mxnet/__init__.py` only
re-export names defined in the modules that own them. Griffe treats an imported name as private unless the
module lists it in `__all__`, so the API reference would show none of them.
This extension marks every such re-export public (a name without a leading
underscore that points into tfring and is not a module), so the reference
lists exactly what the packages export, with no list kept by hand.

`tfring/__init__.py` loads its API on first use: it binds each public name
to the module that defines it in its `_API` table, which griffe cannot
follow statically, so the names of that table become aliases here.
"""
import importlib
import sys
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[2]

PACKAGES = ("tfring", "tfring.keras", "tfring.keras.callbacks", "tfring.torch",
            "tfring.mxnet")
# Read statically only: importing them needs a framework the docs
# environment may lack (MXNet has an environment of its own), and they load
# eagerly, so they have no lazy `_API` table.
STATIC_ONLY = ("tfring.mxnet",)


class PublicReexports(griffe.Extension):
    def on_package(self, *, pkg, **kwargs):
        for path in PACKAGES:
            try:
                module = pkg if path == pkg.path else pkg[path[len(pkg.path) + 1:]]
            except (KeyError, ValueError):
                continue
            for name, target in _lazy_api(path).items():
                module.set_member(name, griffe.Alias(
                    name, f"{path}.{target}.{name}", parent=module))
            for name, member in list(module.members.items()):
                if (not member.is_alias and member.is_module
                        and module.imports.get(name) == f"{member.path}.{name}"
                        and name in member.members):
                    shadowing = griffe.Alias(name, member.members[name],
                                             parent=module)
                    module.set_member(name, shadowing)
                    member = shadowing
                if not member.is_alias or name.startswith("_"):
                    continue
                if not member.target_path.startswith("tfring."):
                    continue  # tensorflow, keras, the standard library
                try:
                    if member.final_target.is_module:
                        continue
                except griffe.AliasResolutionError:
                    continue
                member.public = True


def _lazy_api(path):
    """{public name: defining submodule} of a package that loads lazily."""
    if path in STATIC_ONLY:
        return {}
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return dict(getattr(importlib.import_module(path), "_API", {}))
