"""Models by name from the Hugging Face Hub: `Qwen/Qwen3-0.6B` (safetensors), `org/X-GGUF:Q4_K_M`
(one GGUF quant, all its shards, and the mmproj beside it), fetched through huggingface_hub into
its own cache (HF_HOME / HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT are its), and the
`pull`, `list` and `rm` commands over that cache.

Only the files a model needs are fetched: config, tokenizer, generation config and the weights
(the shards an index lists), or the chosen GGUF file(s). A weight download is resumable: its
bytes go to blobs/<etag>.incomplete, which an interrupted run (Ctrl-C, a dropped connection,
a killed process) leaves behind and the next run continues with an HTTP Range request. Every
downloaded file is checked against the Hub's listing: its size, and its sha256 (LFS files) or
git blob sha1 (small files) before it enters the cache; `pull` checks the files already cached
too. Loading is loader.py's; nothing here parses weights.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from lite_llm.config import hf_env
from lite_llm.model.files import ModelLoadError

log = logging.getLogger("lite_llm")

_HOST_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/", "https://hf.co/")
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# the quant tag ending a GGUF file's stem: Q4_K_M, IQ4_XS, Q8_0, UD-Q4_K_XL, F16, BF16, MXFP4_MOE ...
_QUANT = re.compile(r"(?i)(?:^|[-_.])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|F16|F32|FP16|FP32|MXFP4(?:_MOE)?))$")
_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_DEFAULT_QUANT = "Q4_K_M"           # llama.cpp's default tag
# the files of a safetensors model beside its weights (tokenizer, templates, processors, pooling)
_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
               "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
               "chat_template.jinja", "chat_template.json", "preprocessor_config.json", "processor_config.json",
               "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
_POOLING_CONFIG = re.compile(r"^\d+_Pooling/config\.json$")
_INDEX = "model.safetensors.index.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")


class HubError(ModelLoadError):
    """A name that cannot be resolved or fetched; the message says what was looked for and where."""


# ---- names -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubName:
    repo_id: str            # "org/name"
    tag: str | None         # a GGUF quant tag ("Q4_K_M"), or None

    def __str__(self) -> str:
        return self.repo_id + (f":{self.tag}" if self.tag else "")


def parse_name(name: str) -> HubName | None:
    """`org/name` or `org/name:TAG` (also behind hf.co/), as llama-server's -hf and Ollama spell
    it; None for anything else (a path)."""
    if not isinstance(name, str) or name.startswith((".", "/", "~")):
        return None
    for prefix in _HOST_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    repo, _, tag = name.partition(":")
    if not _NAME.match(repo) or (tag and not re.match(r"^[\w.-]+$", tag)):
        return None
    return HubName(repo, tag or None)


def cache_dir() -> str:
    """huggingface_hub's cache: HF_HUB_CACHE, else $HF_HOME/hub, else its default (as it read them at
    import; read again here, so that a change of them in this process is followed too)."""
    if hf_env("HF_HUB_CACHE"):
        return os.path.expanduser(hf_env("HF_HUB_CACHE"))
    if hf_env("HF_HOME"):
        return os.path.join(os.path.expanduser(hf_env("HF_HOME")), "hub")
    from huggingface_hub import constants
    return constants.HF_HUB_CACHE


def _repo_dir(repo_id: str) -> str:
    return os.path.join(cache_dir(), "models--" + repo_id.replace("/", "--"))


def _endpoint() -> str:
    from huggingface_hub import constants
    return constants.ENDPOINT


# ---- which files ---------------------------------------------------------------------------------


def quant_of(path: str) -> str | None:
    """The quant tag of a GGUF file name (shard suffix ignored), upper case, or None."""
    base = os.path.basename(path)
    m = _SHARD.match(base)
    stem = m.group(1) if m else base[:-len(".gguf")] if base.lower().endswith(".gguf") else base
    q = _QUANT.search(stem)
    if q is None:       # unsloth keeps large quants in a folder named by the tag: Q8_0/X-Q8_0-00001-of-00002.gguf
        folder = os.path.basename(os.path.dirname(path))
        q = _QUANT.fullmatch(folder) and _QUANT.search(folder)
    return q.group(1).upper() if q else None


def _is_mmproj(path: str) -> bool:
    return os.path.basename(path).lower().startswith("mmproj")


def _gguf_models(files: list[str]) -> dict[str | None, list[str]]:
    """GGUF model files (no mmproj) by quant tag: {tag: [first shard or only file, other shards]}."""
    out: dict[str | None, list[str]] = {}
    for f in sorted(files):
        if f.lower().endswith(".gguf") and not _is_mmproj(f):
            out.setdefault(quant_of(f), []).append(f)
    return out


def pick_gguf(name: HubName, files: list[str], where: str) -> list[str]:
    """The GGUF file(s) of name's tag (a quant, or a file's own name): one file, or every shard of
    one split model."""
    by_tag = _gguf_models(files)
    tags = sorted(t for t in by_tag if t)
    listed = ", ".join(tags) if tags else "none tagged"
    if name.tag is not None and name.tag.lower().endswith(".gguf"):
        hit = [f for g in by_tag.values() for f in g if name.tag.lower() in (f.lower(), os.path.basename(f).lower())]
        if not hit:
            raise HubError(f"{where} has no GGUF model file {name.tag} (quants: {listed})")
        tag = quant_of(hit[0])
        base = _SHARD.match(hit[0])
        chosen = [f for f in by_tag[tag] if (_SHARD.match(f) and base and _SHARD.match(f).group(1) == base.group(1))
                  or f == hit[0]]
        return _whole(chosen, where)
    if name.tag is None:
        if _DEFAULT_QUANT in by_tag:
            tag = _DEFAULT_QUANT
        elif len(by_tag) == 1:
            tag = next(iter(by_tag))
        else:
            raise HubError(f"{where} holds several GGUF models: pick one as {name.repo_id}:QUANT "
                           f"(available: {listed})")
    else:
        want = name.tag.upper()     # unsloth's dynamic quants answer to their tag without "UD-" too
        tag = next((t for t in by_tag if t == want), None) or next((t for t in by_tag if t == "UD-" + want), None)
        if tag is None:
            raise HubError(f"{where} has no GGUF file of quant {name.tag} (available: {listed})")
    chosen = by_tag[tag]
    groups: dict[str, list[str]] = {}       # one split model, or one plain file, per group
    for f in chosen:
        m = _SHARD.match(f)
        groups.setdefault(m.group(1) if m else f, []).append(f)
    if len(groups) > 1:
        raise HubError(f"{where} has {len(groups)} GGUF models of quant {tag} "
                       f"({', '.join(sorted(groups))[:300]}): name one as {name.repo_id}:FILE.gguf")
    return _whole(chosen, where)


def _whole(group: list[str], where: str) -> list[str]:
    """One model's files, first shard first, every shard of a split model there."""
    first = _SHARD.match(group[0])
    if first:
        count = int(first.group(3))
        want = [f"{first.group(1)}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
        missing = [w for w in want if w not in group and w.lower() not in {g.lower() for g in group}]
        if missing:
            raise HubError(f"{where} lacks shard(s) {', '.join(missing)} of the split GGUF")
        group = sorted(group)
    return group


def pick_mmproj(files: list[str], tag: str | None) -> str | None:
    """The mmproj GGUF beside a vision model: of the model's own tag if there is one, else F16,
    BF16, F32, else the first by name."""
    mm = sorted(f for f in files if _is_mmproj(f) and f.lower().endswith(".gguf"))
    if not mm:
        return None
    for want in (tag, "F16", "BF16", "F32"):
        for f in mm:
            if want and quant_of(f) == want:
                return f
    return mm[0]


def safetensors_files(files: list[str]) -> list[str]:
    """Side files and weights of a safetensors model (the index's shards are added once it is here)."""
    present = set(files)
    side = [f for f in _SIDE_FILES if f in present] + sorted(f for f in files if _POOLING_CONFIG.match(f))
    if _INDEX in present:
        return side + [_INDEX]
    if "model.safetensors" in present:
        return side + ["model.safetensors"]
    # top-level weights; Mistral's consolidated.safetensors duplicates the HF-named ones
    return side + sorted(f for f in files if "/" not in f and f.endswith(".safetensors")
                         and not f.startswith("consolidated"))


def _is_safetensors_repo(files: list[str]) -> bool:
    return "config.json" in files and any(f.endswith(".safetensors") and "/" not in f for f in files)


# ---- the listing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Remote:
    size: int | None
    sha256: str | None      # LFS files
    git_sha1: str | None    # the others: git's blob id


def _remote_listing(repo_id: str, revision: str) -> tuple[str, dict[str, _Remote]]:
    """(commit, {path: _Remote}) of the repo at revision, from the Hub's model info."""
    from huggingface_hub import HfApi
    info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    files = {s.rfilename: _Remote(s.size, s.lfs.sha256 if s.lfs else None, None if s.lfs else s.blob_id)
             for s in info.siblings or []}
    return info.sha, files


def _cached_listing(repo_id: str, revision: str) -> tuple[str, dict[str, _Remote | None]] | None:
    """(commit, {path: None}) of the files the cache holds of repo_id at revision, or None."""
    repo_dir = _repo_dir(repo_id)
    commit = revision
    ref = os.path.join(repo_dir, "refs", revision)
    if os.path.isfile(ref):
        with open(ref) as fh:
            commit = fh.read().strip()
    snap = os.path.join(repo_dir, "snapshots", commit)
    if not os.path.isdir(snap):
        return None
    files: dict[str, _Remote | None] = {}
    for root, _, names in os.walk(snap):
        for n in names:
            full = os.path.join(root, n)
            if os.path.isfile(full):        # a dangling link is no file
                files[os.path.relpath(full, snap).replace(os.sep, "/")] = None
    return commit, files


def _offline() -> bool:
    from huggingface_hub import is_offline_mode
    return bool(is_offline_mode()) or (hf_env("HF_HUB_OFFLINE") or "").upper() in ("1", "ON", "YES", "TRUE")


def _listing(name: HubName, revision: str) -> tuple[str, dict[str, _Remote | None], bool]:
    """(commit, files, online): the Hub's listing, or the cache's when offline or unreachable."""
    import httpx2
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    where = f"the local Hugging Face cache ({cache_dir()})"
    rev = "" if revision == "main" else f" at revision {revision}"
    for quiet in ("httpx", "httpx2"):      # a line per HTTP request of a download is no server log
        if logging.getLogger(quiet).level == logging.NOTSET:
            logging.getLogger(quiet).setLevel(logging.WARNING)
    if _offline():
        cached = _cached_listing(name.repo_id, revision)
        if cached is None:
            raise HubError(f"{name}{rev}: not in {where}, and HF_HUB_OFFLINE=1 forbids downloading it")
        return (*cached, False)
    try:
        commit, files = _remote_listing(name.repo_id, revision)
        return commit, files, True
    except RevisionNotFoundError:
        raise HubError(f"{name}: no revision {revision!r} on {_endpoint()}") from None
    except RepositoryNotFoundError as e:       # or gated, or private without a token: the cache may have it
        cached = _cached_listing(name.repo_id, revision)
        if cached is not None:
            return (*cached, False)
        if isinstance(e, GatedRepoError):
            raise HubError(f"{name}: a gated repository on {_endpoint()}: accept its terms on the Hub and set "
                           "HF_TOKEN") from None
        raise HubError(f"{name}: no such model on {_endpoint()} (or it is private: set HF_TOKEN), "
                       f"nor in {where}") from None
    except (httpx2.ConnectError, httpx2.TimeoutException, OfflineModeIsEnabled, HfHubHTTPError) as e:
        cached = _cached_listing(name.repo_id, revision)
        if cached is not None:
            log.warning("%s: %s cannot be reached (%s): using the cached copy", name, _endpoint(), type(e).__name__)
            return (*cached, False)
        raise HubError(f"{name}{rev}: not in {where}, and {_endpoint()} cannot be reached "
                       f"({type(e).__name__})") from None


# ---- fetching one file -----------------------------------------------------------------------------


def _progress_class():
    """huggingface_hub's progress bar (HF_HUB_DISABLE_PROGRESS_BARS applies), drawn only on a terminal."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Bar(hf_tqdm):
        def __init__(self, *args, **kwargs):
            if not sys.stderr.isatty():
                kwargs["disable"] = True
            super().__init__(*args, **kwargs)
    return Bar


def _file_hash(path: str, git: bool) -> str:
    """sha256 of the file, or (git) git's blob sha1 of it."""
    import hashlib      # deferred: OpenSSL stays out of processes that resolve no Hub name (bench, serve of a path)
    h = hashlib.sha1(b"blob %d\0" % os.path.getsize(path)) if git else hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _check(path: str, filename: str, size: int | None, digest: str | None) -> str | None:
    """Why the file at path is not the Hub's `filename` (size, then sha256 or git sha1), or None."""
    actual = os.path.getsize(path)
    if size is not None and actual != size:
        return f"{actual} bytes where the Hub's {filename} has {size}"
    if digest and (_SHA256.match(digest) or _SHA1.match(digest)):
        got = _file_hash(path, git=len(digest) == 40)
        if got != digest:
            return f"{'sha256' if len(digest) == 64 else 'git sha1'} {got[:12]}... where the Hub's {filename} has {digest[:12]}..."
    return None


def cached_pointer(repo_id: str, commit: str, filename: str) -> str:
    """Where the Hugging Face cache keeps `filename` of repo_id at commit (a snapshot's link)."""
    return os.path.join(_repo_dir(repo_id), "snapshots", commit, *filename.split("/"))


def _drop_cached(pointer: str) -> None:
    """Remove a cached file: its blob and its snapshot link."""
    blob = os.path.realpath(pointer)
    for p in (blob, pointer):
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def _fetch(repo_id: str, commit: str, filename: str, remote: _Remote | None, verify: bool) -> str:
    """_fetch_file, its network and disk failures told in one line (a partial download stays to resume)."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError
    try:
        return _fetch_file(repo_id, commit, filename, remote, verify)
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HubError(f"{repo_id}: fetching {filename} from {_endpoint()} failed ({first[:200]}); "
                       "run again to resume") from e


def _fetch_file(repo_id: str, commit: str, filename: str, remote: _Remote | None, verify: bool) -> str:
    """The snapshot path of repo_id's `filename` at commit, downloaded if needed (resuming a partial
    download), checked against the listing: size always, hash when downloaded or `verify`."""
    pointer = cached_pointer(repo_id, commit, filename)
    if os.path.isfile(pointer):
        if remote is None:
            return pointer
        bad = _check(pointer, filename, remote.size,
                     (remote.sha256 or remote.git_sha1) if verify else None)
        if bad is None:
            return pointer
        log.warning("%s: the cached %s is damaged (%s): downloading it again", repo_id, filename, bad)
        _drop_cached(pointer)
    if remote is None:      # offline, and the file is not in the cache
        raise HubError(f"{repo_id}: {filename} is not in the local Hugging Face cache ({cache_dir()}) and the Hub "
                       "cannot be asked (HF_HUB_OFFLINE=1 or no connection)")
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import WeakFileLock, build_hf_headers
    from huggingface_hub.utils._runtime import is_xet_available
    url = hf_hub_url(repo_id, filename, revision=commit)
    meta = get_hf_file_metadata(url)
    etag, size = meta.etag, meta.size if meta.size is not None else remote.size
    expected = remote.sha256 or remote.git_sha1 or etag
    if meta.xet_file_data is not None and is_xet_available():
        # Xet storage: hf_xet fetches (and caches) the chunks; the check is the same afterwards
        path = hf_hub_download(repo_id, filename, revision=commit, cache_dir=cache_dir(),
                               tqdm_class=_progress_class())
    else:
        blob = os.path.join(_repo_dir(repo_id), "blobs", etag)
        lock = os.path.join(cache_dir(), ".locks", os.path.basename(_repo_dir(repo_id)), f"{etag}.lock")
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        os.makedirs(os.path.dirname(lock), exist_ok=True)
        with WeakFileLock(lock):
            if not os.path.isfile(blob):
                partial = blob + ".incomplete"
                with open(partial, "ab") as fh:
                    done = fh.tell()
                    if size is not None and done > size:    # not this file's beginning
                        fh.truncate(0)
                        done = 0
                    if done:
                        log.info("%s: resuming %s at %d of %s bytes", repo_id, filename, done, size)
                    headers = build_hf_headers()
                    headers["Accept-Encoding"] = "identity"     # byte ranges of the file itself
                    source = meta.location if meta.xet_file_data is None else url    # Xet's bridge: the Hub's URL
                    if urlsplit(source).netloc != urlsplit(url).netloc:
                        headers.pop("authorization", None)      # a CDN's signed URL: the token stays home
                    http_get(source, fh, resume_size=done, headers=headers, expected_size=size,
                             displayed_filename=filename, tqdm_class=_progress_class())
                bad = _check(partial, filename, size, expected)
                if bad is not None:
                    os.remove(partial)
                    raise HubError(f"{repo_id}: the download of {filename} is corrupt ({bad}); it was deleted: "
                                   "run again to fetch it anew")
                os.replace(partial, blob)
        # the blob is in place: huggingface_hub links it into the snapshot (and keeps its own bookkeeping)
        return hf_hub_download(repo_id, filename, revision=commit, cache_dir=cache_dir())
    bad = _check(path, filename, size, expected)
    if bad is not None:
        _drop_cached(path)
        raise HubError(f"{repo_id}: the download of {filename} is corrupt ({bad}); it was deleted: run again")
    return path


# ---- resolving a name -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubModel:
    name: str               # as asked: "org/name" or "org/name:TAG"
    repo_id: str
    revision: str
    commit: str
    format: str             # "safetensors" | "gguf"
    quant: str | None       # the GGUF tag
    path: str               # the snapshot directory (safetensors) or the (first) GGUF file
    mmproj: str | None      # the mmproj GGUF beside a vision GGUF model
    files: tuple[str, ...]  # repo paths of the files the model uses


_RESOLVED: dict[tuple[str, str, bool, bool], HubModel] = {}


def resolve(name: str | HubName, revision: str | None = None, *, mmproj: bool = True,
            verify: bool = False) -> HubModel:
    """The local files of model `name`, fetched into the cache first if missing. verify: hash the
    cached files too (pull). Answers are remembered for the process (one listing per name)."""
    ref = name if isinstance(name, HubName) else parse_name(name)
    if ref is None:
        raise HubError(f"{name}: not a Hugging Face model name (org/name or org/name:QUANT)")
    revision = revision or "main"
    key = (str(ref), revision, mmproj, verify)
    if key in _RESOLVED and os.path.exists(_RESOLVED[key].path):
        return _RESOLVED[key]
    commit, listing, online = _listing(ref, revision)
    files = list(listing)
    where = (f"{ref.repo_id} on {_endpoint()}" if online
             else f"{ref.repo_id} in the local Hugging Face cache ({cache_dir()})")
    has_gguf = any(f.lower().endswith(".gguf") for f in files)
    if ref.tag is None and _is_safetensors_repo(files):
        fmt, quant, wanted, mm = "safetensors", None, safetensors_files(files), None
    elif has_gguf:
        fmt = "gguf"
        wanted = pick_gguf(ref, files, where)
        quant = quant_of(wanted[0])
        mm = pick_mmproj(files, quant) if mmproj else None
        if mm:
            wanted = wanted + [mm]
    elif ref.tag is not None and _is_safetensors_repo(files):
        raise HubError(f"{where} holds safetensors weights, no GGUF files: drop the :{ref.tag}")
    else:
        raise HubError(f"{where} holds no model lite-llm loads (config.json with *.safetensors, "
                       "or *.gguf files)" + ("" if online else "; connect to fetch it, or `lite-llm pull` it"))
    paths = {f: _fetch(ref.repo_id, commit, f, listing.get(f), verify) for f in wanted}
    if _INDEX in paths:         # the shards the index lists
        try:
            with open(paths[_INDEX], encoding="utf-8") as fh:
                shards = sorted(set(json.load(fh).get("weight_map", {}).values()))
        except (OSError, ValueError) as e:
            raise HubError(f"{ref}: {_INDEX} is unreadable: {e}") from None
        for f in shards:
            if f not in listing:
                raise HubError(f"{ref}: {_INDEX} lists {f}, which {where} does not hold")
            paths[f] = _fetch(ref.repo_id, commit, f, listing.get(f), verify)
            wanted.append(f)
    if online and revision != commit:      # the branch or tag -> commit, for offline use
        from huggingface_hub.file_download import _cache_commit_hash_for_specific_revision
        _cache_commit_hash_for_specific_revision(_repo_dir(ref.repo_id), revision, commit)
    snapshot = os.path.join(_repo_dir(ref.repo_id), "snapshots", commit)
    main_file = paths[wanted[0]] if fmt == "gguf" else paths["config.json"]
    _touch(main_file)
    model = HubModel(name=str(ref), repo_id=ref.repo_id, revision=revision, commit=commit, format=fmt, quant=quant,
                     path=snapshot if fmt == "safetensors" else paths[wanted[0]],
                     mmproj=paths[mm] if fmt == "gguf" and mm else None, files=tuple(wanted))
    _RESOLVED[key] = model
    return model


def _touch(link: str) -> None:
    """Mark a model used now: the mtime of its snapshot link (`list` shows it as last used)."""
    try:
        os.utime(link, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass    # a read-only cache: last used stays the download time


# ---- serve flags -----------------------------------------------------------------------------------


def add_hub_args(parser: argparse.ArgumentParser) -> None:
    """serve's flags for models by name."""
    parser.add_argument("-hf", "--hf-repo", default=None, metavar="ORG/NAME[:QUANT]",
                        help="a model on the Hugging Face Hub, as llama-server spells it: a safetensors repo, or a GGUF "
                             "repo and its quant tag (case-insensitive; default Q4_K_M, else the only one); fetched "
                             "into the Hugging Face cache when missing (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT). "
                             "The model argument takes the same names")
    parser.add_argument("--revision", default=None,
                        help="branch, tag or commit of a Hub model (default: main)")
    parser.add_argument("--no-mmproj", action="store_true",
                        help="do not fetch or use the mmproj file beside a GGUF model from the Hub (text only)")


def resolve_serve_args(args: argparse.Namespace) -> str | None:
    """Turn a Hub name in serve's model argument (or -hf) into local paths, in place: args.model
    becomes the file or directory, args.mmproj the mmproj beside it (unless given), and the
    served model name defaults to the name as typed. Returns the model argument after that."""
    hf = getattr(args, "hf_repo", None)
    model = getattr(args, "model", None) or getattr(args, "model_flag", None)
    if hf and model:
        raise HubError(f"-hf {hf} and the model {model} both name a model: give one")
    name = hf or model
    if name is None or (not hf and os.path.exists(os.path.expanduser(name))):
        return model
    ref = parse_name(name)
    if ref is None:
        if hf:
            raise HubError(f"-hf {hf}: not a Hugging Face model name (org/name or org/name:QUANT)")
        return model
    found = resolve(ref, getattr(args, "revision", None), mmproj=not getattr(args, "no_mmproj", False))
    args.model, args.model_flag = found.path, None
    if found.mmproj and getattr(args, "mmproj", None) is None:
        args.mmproj = found.mmproj
        log.info("%s: image encoder from %s", ref, os.path.basename(found.mmproj))
    if not getattr(args, "served_model_name", None):
        args.served_model_name = [str(ref)]
    return found.path


# ---- the cache: pull, list, rm ----------------------------------------------------------------------


@dataclass(frozen=True)
class CachedModel:
    name: str               # org/name, org/name:TAG, with @revision when not main's snapshot
    format: str
    quant: str | None
    size: int               # bytes of its files
    last_used: float        # seconds since the epoch
    path: str


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _hf_quant(snapshot: str) -> str | None:
    """A safetensors model's weight type from its config.json (a quantization method, else the dtype)."""
    try:
        with open(os.path.join(snapshot, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        return None
    q = cfg.get("quantization_config") or {}
    if q.get("quant_method"):
        bits = q.get("bits") or q.get("w_bit")
        return f"{q['quant_method']}{f'-{bits}bit' if bits else ''}"
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or (cfg.get("text_config") or {}).get("dtype")
    return {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(str(dtype), dtype)


def cached_models() -> list[CachedModel]:
    """The models the cache holds (a safetensors repo, one entry per GGUF quant), newest use first."""
    root = cache_dir()
    out: list[CachedModel] = []
    if not os.path.isdir(root):
        return out
    for d in sorted(os.listdir(root)):
        if not d.startswith("models--"):
            continue
        repo_id = d[len("models--"):].replace("--", "/", 1)
        repo_dir = os.path.join(root, d)
        refs: dict[str, str] = {}
        for r_root, _, names in os.walk(os.path.join(repo_dir, "refs")):
            for n in names:
                with open(os.path.join(r_root, n)) as fh:
                    refs.setdefault(fh.read().strip(),
                                    os.path.relpath(os.path.join(r_root, n), os.path.join(repo_dir, "refs")))
        snaps = os.path.join(repo_dir, "snapshots")
        for commit in sorted(os.listdir(snaps)) if os.path.isdir(snaps) else []:
            listing = _cached_listing(repo_id, commit)
            if listing is None:
                continue
            files = list(listing[1])
            snap = os.path.join(snaps, commit)
            ref = refs.get(commit, commit[:12])
            suffix = "" if ref == "main" else f"@{ref}"
            if _is_safetensors_repo(files):
                parts = [os.path.join(snap, f) for f in files if not f.lower().endswith(".gguf")]
                out.append(CachedModel(repo_id + suffix, "safetensors", _hf_quant(snap), sum(map(_size, parts)),
                                       os.lstat(os.path.join(snap, "config.json")).st_mtime, snap))
            for tag, group in _gguf_models(files).items():
                first = os.path.join(snap, group[0])
                name = f"{repo_id}:{tag}" if tag else repo_id
                out.append(CachedModel(name + suffix, "gguf", tag, sum(_size(os.path.join(snap, f)) for f in group),
                                       os.lstat(first).st_mtime, first))
    return sorted(out, key=lambda m: -m.last_used)


def remove(name: str) -> tuple[int, list[str]]:
    """Delete model `name` from the cache: a whole repo (every revision), or with a :TAG that quant's
    GGUF files only. (bytes freed, what was removed)."""
    ref = parse_name(name)
    if ref is None:
        raise HubError(f"{name}: not a Hugging Face model name (org/name or org/name:QUANT)")
    repo_dir = _repo_dir(ref.repo_id)
    if not os.path.isdir(repo_dir):
        raise HubError(f"{name}: not in the local Hugging Face cache ({cache_dir()})")
    if ref.tag is None:
        from huggingface_hub import scan_cache_dir
        info = scan_cache_dir(cache_dir())
        repo = next((r for r in info.repos if r.repo_id == ref.repo_id and r.repo_type == "model"), None)
        freed = repo.size_on_disk if repo else 0
        if repo is not None and repo.revisions:
            info.delete_revisions(*(r.commit_hash for r in repo.revisions)).execute()
        import shutil
        shutil.rmtree(repo_dir, ignore_errors=True)     # what the strategy leaves: refs, partial downloads
        return freed, [ref.repo_id]
    removed, links = [], []
    snaps = os.path.join(repo_dir, "snapshots")
    for commit in os.listdir(snaps) if os.path.isdir(snaps) else []:
        listing = _cached_listing(ref.repo_id, commit)
        by_tag = _gguf_models(list(listing[1])) if listing else {}
        for tag, group in by_tag.items():
            if tag and tag.lower() == ref.tag.lower():
                links += [os.path.join(snaps, commit, f) for f in group]
                removed += group
    if not links:
        raise HubError(f"{name}: the cached {ref.repo_id} ({cache_dir()}) holds no GGUF file of quant {ref.tag}")
    blobs = {os.path.realpath(p) for p in links}
    for p in links:
        os.remove(p)
    if not any(m.path.startswith(repo_dir + os.sep) for m in cached_models()):
        ours = sum(_size(b) for b in blobs)
        freed, _ = remove(ref.repo_id)      # nothing loadable left (an mmproj alone): the whole repo goes
        return freed + ours, sorted(set(removed))
    still = set()       # blobs other snapshot files point at stay
    for r_root, _, names in os.walk(snaps):
        for n in names:
            still.add(os.path.realpath(os.path.join(r_root, n)))
    freed = 0
    for b in blobs - still:
        freed += _size(b)
        try:
            os.remove(b)
        except FileNotFoundError:
            pass
    return freed, sorted(set(removed))


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _ago(t: float) -> str:
    s = max(0, time.time() - t)
    for unit, length in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if s >= length:
            k = int(s // length)
            return f"{k} {unit}{'s' if k > 1 else ''} ago"
    return "just now"


def add_pull_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="ORG/NAME (safetensors) or ORG/NAME:QUANT (one GGUF quant)")
    parser.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    parser.add_argument("--no-mmproj", action="store_true", help="skip the mmproj file beside a GGUF model")


def run_pull(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)      # ours (resuming, refetching), not every HTTP request's
    found = resolve(args.name, args.revision, mmproj=not args.no_mmproj, verify=True)
    size = sum(_size(cached_pointer(found.repo_id, found.commit, f)) for f in found.files)
    print(f"{found.name}: {len(found.files)} file{'s' if len(found.files) != 1 else ''}, {_human(size)}, {found.format}"
          f"{f' {found.quant}' if found.quant else ''}, commit {found.commit[:12]}, checked")
    print(found.path)
    return 0


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run_list(args: argparse.Namespace) -> int:
    models = cached_models()
    if not models:
        print(f"no models in {cache_dir()}")
        return 0
    rows = [("NAME", "SIZE", "FORMAT", "QUANT", "LAST USED")]
    rows += [(m.name, _human(m.size), m.format, m.quant or "-", _ago(m.last_used)) for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def add_rm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="ORG/NAME (every file and revision) or ORG/NAME:QUANT")


def run_rm(args: argparse.Namespace) -> int:
    freed, removed = remove(args.name)
    print(f"deleted {args.name} ({', '.join(removed) if ':' in args.name else 'all revisions'}; {_human(freed)} freed)")
    return 0

