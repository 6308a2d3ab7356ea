"""Imports mlx-lm's model modules without running mlx_lm/__init__.py, which imports transformers
(not installed beside the mlx-lm wheel here). Shared by the interop scripts in this folder and
bench/mlx_lm_attention_bench.py, mlx_lm_model_step.py and mlx_lm_prefill.py.
"""
import importlib
import os
import sys
import types


def mlx_lm_models(*names):
    """The modules `mlx_lm.models.<name>` for each name, in order. (Called again, it finds the
    packages it made the first time: they have no spec to look up.)"""
    if "mlx_lm.models" not in sys.modules:
        root = os.path.dirname(importlib.util.find_spec("mlx_lm").origin)
        for name, path in (("mlx_lm", root), ("mlx_lm.models", os.path.join(root, "models"))):
            if name not in sys.modules:
                module = types.ModuleType(name)
                module.__path__ = [path]
                sys.modules[name] = module
    return tuple(importlib.import_module(f"mlx_lm.models.{n}") for n in names)
