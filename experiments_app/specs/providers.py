"""The model providers: one row per API an agent or a role (answerer, judge) may call (no Django).

Each row says which worker variables hold the key and the endpoint, the endpoint used when none
is set, and how the key is sent. The agent kinds (`agent_kinds`), the experiment form, the
gateway (`runs_app.engine.gateway.providers`: keys in, placeholders out) and the roles read it
here; nothing else names a key variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Provider:
    name: str
    key_variable: str  # the worker's variable holding the key (never in a sandbox)
    url_variable: str  # the worker's variable that may point to another endpoint
    default_url: str  # `{region}` is the variant's `region` (or `default_region`)
    # How the gateway sends the key: "x-api-key", "x-goog-api-key" or "bearer".
    auth: str = "bearer"
    # A bearer token the worker may hold instead of the key (a gateway in front of the API).
    token_variable: str = ""
    default_region: str = ""
    # A role's request path below the endpoint and its default model; "" when roles cannot use it.
    role_path: str = ""
    role_model: str = ""

    def credential(self, environ: Mapping[str, str]) -> tuple[str, bool]:
        """The key a worker holds for this API in `environ`, and whether it is the token
        variable's (sent as a bearer token); ("", False) when it holds none."""
        if environ.get(self.key_variable):
            return environ[self.key_variable], False
        if self.token_variable and environ.get(self.token_variable):
            return environ[self.token_variable], True
        return "", False


PROVIDERS: dict[str, Provider] = {
    provider.name: provider
    for provider in (
        Provider(
            "anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "https://api.anthropic.com",
            auth="x-api-key", token_variable="ANTHROPIC_AUTH_TOKEN", role_path="v1/messages",
            role_model="claude-sonnet-4-6",
        ),
        Provider(
            "openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", "https://api.openai.com/v1",
            role_path="v1/chat/completions", role_model="gpt-4.1",
        ),
        Provider(
            "gemini", "GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "https://generativelanguage.googleapis.com",
            auth="x-goog-api-key",
        ),
        # Claude on Google Vertex AI / Amazon Bedrock (claude-code's `provider`): a bearer token
        # each, at the region's endpoint.
        Provider(
            "vertex", "VERTEX_ACCESS_TOKEN", "ANTHROPIC_VERTEX_BASE_URL",
            "https://{region}-aiplatform.googleapis.com/v1", default_region="us-east5",
        ),
        Provider(
            "bedrock", "AWS_BEARER_TOKEN_BEDROCK", "ANTHROPIC_BEDROCK_BASE_URL",
            "https://bedrock-runtime.{region}.amazonaws.com", default_region="us-east-1",
        ),
    )
}  # fmt: skip
ROLE_PROVIDERS = tuple(name for name, provider in PROVIDERS.items() if provider.role_path)


def keyed(environ: Mapping[str, str]) -> list[str]:
    """The providers a worker holds a key (or token) for: what it reports of itself, never the
    keys themselves (the workers page, launch pre-flight)."""
    return [name for name, provider in PROVIDERS.items() if provider.credential(environ)[0]]


def key_variables() -> list[str]:
    """Every worker variable that holds a model key or token."""
    names = [provider.key_variable for provider in PROVIDERS.values()]
    return names + [provider.token_variable for provider in PROVIDERS.values() if provider.token_variable]
