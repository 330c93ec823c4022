"""The provider table (`experiments_app.specs.providers`) as the gateway uses it: the real key and
endpoint of each API from the worker's environment (`Upstream`), and what a sandbox gets instead
(placeholder keys, the gateway's URLs). No Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from experiments_app.specs.providers import PROVIDERS, ROLE_PROVIDERS, Provider

PLACEHOLDER_KEY = "evalsite-gateway-placeholder-key"
# The port the forwarder listens on, on the sandbox's own loopback (each sandbox has its own).
SANDBOX_PORT = 8765
SANDBOX_URL = f"http://127.0.0.1:{SANDBOX_PORT}"


class ProviderError(RuntimeError):
    """A provider cannot be called from this worker (no key, an unknown name)."""


@dataclass(frozen=True)
class Upstream:
    """One API the agent may reach: where it really is, and the key the gateway adds."""

    api: str  # a provider's name
    base_url: str
    key: str = ""
    # The provider's token variable held the credential: sent as a bearer token (Anthropic's
    # ANTHROPIC_AUTH_TOKEN, as Claude Code sends it).
    bearer: bool = False

    def auth_headers(self) -> dict[str, str]:
        if not self.key:
            return {}
        auth = PROVIDERS[self.api].auth
        if auth == "bearer" or self.bearer:
            return {"Authorization": f"Bearer {self.key}"}
        return {auth: self.key}

    @property
    def sandbox_url(self) -> str:
        """The base URL the agent is given (OpenAI clients expect the /v1 in it)."""
        suffix = (
            "/v1" if self.api == "openai" and urlsplit(self.base_url).path.rstrip("/").endswith("/v1") else ""
        )
        return f"{SANDBOX_URL}/{self.api}{suffix}"


def provider(name: str) -> Provider:
    if name not in PROVIDERS:
        raise ProviderError(f"unknown model provider {name!r} (providers: {', '.join(PROVIDERS)})")
    return PROVIDERS[name]


def upstream(name: str, environ: Mapping[str, str], base_url: str = "", region: str = "") -> Upstream:
    """Where the worker reaches provider `name`: `base_url`, else the provider's URL variable,
    else its default endpoint (in `region`), with the key (or token) the worker holds, if any."""
    row = provider(name)
    default = row.default_url.format(region=region or row.default_region)
    key, bearer = row.credential(environ)
    return Upstream(name, str(base_url or environ.get(row.url_variable) or default), key, bearer)


def role_upstream(environ: Mapping[str, str], provider_variable: str) -> Upstream:
    """The API a role (answerer, judge) calls, chosen by `provider_variable` in the worker's
    environment (anthropic by default); refused when the worker holds no key for it."""
    name = (environ.get(provider_variable) or "anthropic").strip().lower()
    if name not in ROLE_PROVIDERS:
        raise ProviderError(f"{provider_variable} must be one of {', '.join(ROLE_PROVIDERS)}, not {name!r}")
    found = upstream(name, environ)
    if not found.key:
        row = PROVIDERS[name]
        raise ProviderError(
            f"{row.key_variable} is not set in the worker's environment; set it (and {row.url_variable} "
            f"for a compatible server), or {provider_variable}=openai / anthropic for the other API"
        )
    return found


def sandbox_variables(upstreams: Iterable[Upstream], every_key: bool = True) -> dict[str, str]:
    """What a sandbox holds instead of the worker's variables of these providers: a placeholder
    key and the gateway's URL. With `every_key` False, a placeholder only where the worker has
    a key (what an agent kind checks before it starts: one that needs a key then says which)."""
    env: dict[str, str] = {}
    for found in upstreams:
        row = PROVIDERS[found.api]
        if found.key or every_key:
            env[row.key_variable] = PLACEHOLDER_KEY
        env[row.url_variable] = found.sandbox_url
    return env


def worker_variables(names: Iterable[str]) -> set[str]:
    """The worker variables of these providers that a sandbox must never see."""
    out = set()
    for name in names:
        row = PROVIDERS[name]
        out |= {row.key_variable, row.url_variable} | ({row.token_variable} - {""})
    return out
