"""What the CLI checks before it starts Ray or loads a model: the ports are free and each model name is one
that can load. Each failure is a ValueError of one line naming the problem; nothing here imports torch."""

from __future__ import annotations

import difflib
import errno
import re
import socket
from pathlib import Path

from specserve.models.draft_names import NGRAM
from specserve.models.registry import PRESETS

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
HUB_TIMEOUT_S = 5.0


class PortInUseError(ValueError):
    pass


def check_port_free(host: str, port: int | None, flag: str) -> None:
    """Raises PortInUseError when a server could not listen on host:port (None and 0: nothing to check)."""
    if not port:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ValueError(f"cannot listen on {host}: {error.strerror}") from error
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no obstacle
        try:
            sock.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                reason = f"{error.strerror}; {flag} picks another"
                raise PortInUseError(f"port {port} on {host} is in use ({reason})") from error
            raise ValueError(f"cannot listen on {host}:{port}: {error.strerror}") from error


def check_model_name(name: str, local: bool = True) -> None:
    """Raises ValueError unless `name` is a preset, `ngram` or `MODEL+ngram`, a local directory, or a Hugging
    Face hub id (org/name) that is in the local cache or on a reachable hub. local=False (the models load
    on other machines): only a name that is none of these in form is refused."""
    if name in PRESETS or name == NGRAM:
        return
    if name.endswith("+" + NGRAM):
        return check_model_name(name.removesuffix("+" + NGRAM), local)
    path = Path(name).expanduser()
    if name.startswith(("/", ".", "~")) or path.exists():
        if local and not path.is_dir():
            raise ValueError(f"model {name!r}: no such directory")
        return
    if HUB_ID.fullmatch(name):
        if local:
            _check_hub_id(name)
        return
    close = difflib.get_close_matches(name, list(PRESETS), n=1)
    hint = f"; did you mean {close[0]}?" if close else f"; presets: {', '.join(PRESETS)}"
    raise ValueError(f"unknown model {name!r}: not a preset, a local directory or a Hugging Face id (org/name){hint}")


def _check_hub_id(name: str) -> None:
    """In the local Hugging Face cache, or on the hub. Offline, transformers retries a missing id for ~45 s
    before its traceback; this answers in one quick request."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    where = f"{name!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"model {where} and HF_HUB_OFFLINE is set")
    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # the loader asks with the token it finds; its error says what access is missing
    except RepositoryNotFoundError as error:
        raise ValueError(f"model {name!r}: no such model on {constants.ENDPOINT} (or private, and no token "
                         "given: HF_TOKEN)") from error  # fmt: skip
    except Exception as error:  # noqa: BLE001 - any failure to reach the hub: say so in one line
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"model {where} and the hub ({constants.ENDPOINT}) cannot be reached: {reason}") from error
