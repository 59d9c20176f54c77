"""Ray's token authentication, which memcl keeps on: every Ray process memcl starts or joins runs with
`RAY_AUTH_MODE=token` unless the environment chose a mode itself, so a client without the cluster's token is
refused (an unauthenticated Ray is remote code execution for whoever reaches its ports).

Where the token comes from is Ray's: `RAY_AUTH_TOKEN`, the file `RAY_AUTH_TOKEN_PATH` names, or `~/.ray/auth_token`.
An in-process Ray with none of them gets a new token in `~/.ray/auth_token`, readable by its owner only."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from memcl.pipeline.config import ConfigError

MODE = "RAY_AUTH_MODE"


def token_on() -> bool:
    """Turn token authentication on unless the environment set a mode; whether it is on."""
    if MODE not in os.environ:
        os.environ[MODE] = "token"
        _reload_ray_config()
    return os.environ[MODE].lower() == "token"


def _reload_ray_config() -> None:
    # Ray reads its mode into a process-wide config when it is imported; a mode set later counts only once it is
    # read again (the call Ray makes itself when it turns token authentication on)
    if "ray" in sys.modules:
        from ray._raylet import Config

        Config.initialize("")


def default_token_path() -> Path:
    return Path.home() / ".ray" / "auth_token"


def has_token() -> bool:
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or Path(path or default_token_path()).is_file()


def ensure_local_token() -> None:
    """A token for an in-process Ray where none is set: a new random one in `~/.ray/auth_token`, created readable by
    this user only (Ray would create it with the umask's permissions)."""
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if named and not os.environ.get("RAY_AUTH_TOKEN") and not Path(named).is_file():
        raise ConfigError(f"RAY_AUTH_TOKEN_PATH={named}: no such file (the file holding Ray's token; unset it and "
                          "memcl makes one in ~/.ray/auth_token)")
    if has_token():
        return
    path = default_token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    with os.fdopen(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(secrets.token_hex(32))
    try:
        os.link(draft, path)  # whole or not at all; never over a token another memcl made meanwhile
    except FileExistsError:
        pass
    finally:
        draft.unlink()


def refusal(err: BaseException, address: str) -> ConfigError | None:
    """The one-line error for a Ray cluster that refused to let this process join for want of its token (None when
    `err` is another failure)."""
    chain, seen = [], err
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " ".join(f"{type(e).__name__} {e}" for e in chain)
    if "AuthenticationError" not in text and "InvalidAuthToken" not in text:
        return None
    return _refused(address)


def _refused(address: str) -> ConfigError:
    # Ray reads RAY_AUTH_TOKEN first, then the file RAY_AUTH_TOKEN_PATH names, then its default path
    where = ("RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN")
             else os.environ.get("RAY_AUTH_TOKEN_PATH") or str(default_token_path()))
    what = "refused the token from" if has_token() else "needs its token, and none was found in"
    return ConfigError(f"the Ray cluster at {address} {what} {where}: copy the cluster's token into a file "
                       "readable by you only and set RAY_AUTH_TOKEN_PATH to it (docs/guide.md, 'Running on a cluster')")


def _token() -> str | None:
    """The token Ray would send, found where Ray looks (None: none, or token authentication off here)."""
    if os.environ.get(MODE, "").lower() != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or default_token_path())
    return path.read_text().strip() if path.is_file() else None


def check_token(address: str, timeout: float = 5.0) -> None:
    """Ask the GCS of the cluster at `address` (host:port, or `auto` as Ray resolves it) for its id with the token
    this process would join with, before `ray.init`: a refusal is the one-line ConfigError at once, where Ray itself
    would retry for about 20 s and log a line per try. Anything else (an address that does not resolve or answer, a
    Ray Client address, no gRPC here) is left to `ray.init` and its own errors."""
    if address.startswith("ray://"):
        return
    try:
        import grpc
        from ray._private.services import canonicalize_bootstrap_address
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

        target = canonicalize_bootstrap_address(address)
    except Exception:  # a private Ray API, or no grpc here: ray.init says what is wrong
        return
    if target is None:
        return
    token = _token()
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(target) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout, metadata=metadata)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise _refused(address) from None
