"""Sign-in to the pages through OpenID Connect: the settings, the groups file, the provider and the checks.

A person's browser is sent to the provider with an authorization request
(`response_type=code`, PKCE with S256, a `state` and a `nonce`); those three
secrets ride in a signed cookie that lives ten minutes (`auth.Signer.oidc`),
never in the server's memory, so any server process can finish the sign-in.
The provider sends the browser back to `/login/oidc/callback` with a code; the
server checks the state, exchanges the code at the token endpoint (with the
PKCE verifier, and the client secret if there is one), and checks the ID token
it got: its signature against the provider's published keys (JWKS), `iss` the
configured issuer, `aud` this server's client id (and `azp`, if present),
`exp` not past, and `nonce` the one this browser was given. Any of them off:
OIDC_REFUSED, no session, and a failed login counted. The groups the token
names (the claim `RAILYARD_OIDC_GROUPS_CLAIM`) are mapped to roles and tenants
by the groups file (`RAILYARD_OIDC_GROUPS_FILE`), and the people table is made
to say the same (`sync_person`: source oidc, each change in the access trail);
a person whose groups map to no role signs in and sees nothing (deny by default).

Authlib makes the authorization request and the token exchange (its httpx
client, which computes the S256 challenge) and checks the ID token's claims
(`authlib.oidc.core.CodeIDToken`); joserfc, Authlib's JOSE library, checks the
signature. Discovery (`/.well-known/openid-configuration`) and the keys are
fetched when first needed and kept (the keys fetched again when a token names
one not seen yet: the provider rotated them).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from authlib.integrations.base_client import OAuthError
from authlib.integrations.httpx_client import OAuth2Client
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import (
    BadSignatureError,
    ClaimError,
    ExpiredTokenError,
    InvalidKeyIdError,
    JoseError,
    MissingKeyError,
    UnsupportedAlgorithmError,
)
from joserfc.jwk import KeySet

from engine.core.access import TENANT_NAME
from engine.core.errors import Code, RailyardError, Refused
from engine.core.people import Person, Source, name_problem, role_problem
from engine.runtime.people import People

log = logging.getLogger("railyard.api")

#: The path the provider sends the browser back to: register `<this server>/login/oidc/callback` with it.
CALLBACK_PATH = "/login/oidc/callback"
DEFAULT_GROUPS_CLAIM = "groups"
DEFAULT_ACTOR_CLAIM = "preferred_username"
DEFAULT_SCOPES = "openid profile email"
#: A groups file's `tenants = ["*"]`: the group's members are confined to no tenant (they see every one).
ALL_TENANTS = "*"
#: Clocks differ: an ID token is taken this many seconds past its `exp` (and before its `iat`), no more.
LEEWAY_SECONDS = 60
#: How long a discovery document is kept before it is fetched again.
METADATA_SECONDS = 3600
#: Keys are fetched again for an unknown key id at most this often.
KEYS_REFETCH_SECONDS = 30
HTTP_TIMEOUT_SECONDS = 10.0
#: The signature algorithms an ID token may use: the provider's keys, never a shared secret and never `none`.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")

SETTINGS = (
    "RAILYARD_OIDC_ISSUER",
    "RAILYARD_OIDC_CLIENT_ID",
    "RAILYARD_OIDC_CLIENT_SECRET",
    "RAILYARD_OIDC_GROUPS_FILE",
    "RAILYARD_OIDC_GROUPS_CLAIM",
    "RAILYARD_OIDC_ACTOR_CLAIM",
    "RAILYARD_OIDC_SCOPES",
    "RAILYARD_OIDC_REDIRECT_URI",
    "RAILYARD_OIDC_NAME",
)


# -- the groups file -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Grant:
    """What membership of one group gives: roles, and the tenants its members may work in."""

    roles: frozenset[str] = frozenset()
    tenants: frozenset[str] = frozenset()
    #: `tenants = ["*"]`: not confined to any tenant.
    all_tenants: bool = False


@dataclass(frozen=True, slots=True)
class Access:
    """What a person's groups give them: roles, and tenants (None: not confined)."""

    roles: frozenset[str]
    tenants: frozenset[str] | None
    #: The groups of theirs the file names (the others are ignored).
    matched: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupMap:
    """The groups file: group name -> `Grant`. A person holds the union of their groups' roles.

    Tenants: when no group of the file names any, nobody is confined (a single-tenant install). Once one does,
    everyone is confined to the tenants their groups name (an empty set if they name none: `sync_person` refuses
    such a person), unless one of their groups says `tenants = ["*"]`."""

    groups: Mapping[str, Grant]

    @property
    def confines(self) -> bool:
        return any(grant.tenants or grant.all_tenants for grant in self.groups.values())

    def access(self, groups: Iterable[str]) -> Access:
        matched = tuple(dict.fromkeys(g for g in groups if g in self.groups))
        grants = [self.groups[g] for g in matched]
        roles = frozenset(role for grant in grants for role in grant.roles)
        if not self.confines or any(grant.all_tenants for grant in grants):
            return Access(roles, None, matched)
        return Access(roles, frozenset(t for grant in grants for t in grant.tenants), matched)


def parse_groups(doc: Mapping[str, Any], source: str = "groups file") -> GroupMap:
    """Check a parsed groups file; every problem is reported at once (CONFIG_INVALID).

    [groups.refund-approvers]
    roles = ["refund_approver"]

    [groups.acme-operators]
    roles = ["refund_operator"]
    tenants = ["acme"]
    """
    problems = [f"unknown key {key!r} (expected [groups.NAME] tables)" for key in sorted(set(doc) - {"groups"})]
    table = doc.get("groups")
    if not isinstance(table, dict) or not table:
        problems.append("no group is mapped: add [groups.NAME] tables with roles = [...]")
        table = {}
    found: dict[str, Grant] = {}
    for name, entry in table.items():
        where = f"group {name!r}"
        if not isinstance(entry, dict):
            problems.append(f"{where} is not a table (roles = [...], tenants = [...])")
            continue
        unknown = sorted(set(entry) - {"roles", "tenants"})
        if unknown:
            problems.append(f"{where}: unknown keys {unknown} (expected roles, tenants)")
        roles = entry.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            problems.append(f"{where}: roles must be a list of role names")
            roles = []
        problems += [f"{where}: {problem}" for r in roles if (problem := role_problem(r)) is not None]
        tenants = entry.get("tenants", [])
        everywhere = tenants == [ALL_TENANTS]
        if not everywhere and (
            not isinstance(tenants, list) or not all(isinstance(t, str) and TENANT_NAME.match(t) for t in tenants)
        ):
            problems.append(
                f'{where}: tenants must be a list of tenant names ({TENANT_NAME.pattern}), or ["*"] for all of them'
            )
            tenants = []
        if not roles and not tenants:
            problems.append(f"{where} gives nothing: name its roles, its tenants or both")
        found[str(name)] = Grant(frozenset(roles), frozenset() if everywhere else frozenset(tenants), everywhere)
    if problems:
        raise RailyardError(f"{source}: " + "; ".join(problems), code=Code.CONFIG_INVALID)
    return GroupMap(found)


def read_groups(path: str | Path) -> GroupMap:
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RailyardError(f"cannot read the OIDC groups file {path}: {exc}", code=Code.CONFIG_INVALID) from None
    return parse_groups(doc, f"OIDC groups file {path}")


# -- the settings --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OidcSettings:
    """Who the provider is, who this server is to it, and how its claims become a person."""

    issuer: str
    client_id: str
    groups: GroupMap
    #: None: a public client (PKCE alone proves the code's redeemer).
    client_secret: str | None = None
    groups_claim: str = DEFAULT_GROUPS_CLAIM
    actor_claim: str = DEFAULT_ACTOR_CLAIM
    scopes: str = DEFAULT_SCOPES
    #: None: `<scheme>://<Host>/login/oidc/callback`, https when the cookies are Secure.
    redirect_uri: str | None = None
    #: The provider's name on the login page's button ("Sign in with Keycloak"); default: the issuer's host.
    name: str = ""

    @property
    def host(self) -> str:
        return urlsplit(self.issuer).netloc

    @property
    def display_name(self) -> str:
        return self.name or self.host

    @property
    def by(self) -> str:
        """Who the access trail says made a change the sign-in made: `oidc:<the issuer's host>`."""
        return f"oidc:{self.host}"

    def __repr__(self) -> str:  # the secret never reaches a log line
        return f"OidcSettings(issuer={self.issuer!r}, client_id={self.client_id!r})"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _url_problem(name: str, value: str) -> str | None:
    """Why `value` cannot be the URL setting `name`: https, or http to this machine only (development, tests)."""
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return f"{name} must be an https URL, not {value[:200]!r}"
    if parts.scheme == "http" and not _loopback(parts.hostname):
        return f"{name} must be https (http is only for a provider on this machine): {value[:200]!r}"
    if parts.query or parts.fragment:
        return f"{name} must have no query or fragment: {value[:200]!r}"
    return None


def settings_from_env(environ: Mapping[str, str] | None = None) -> OidcSettings | None:
    """The OpenID Connect settings the environment gives (None: sign-in through OIDC is off), every problem at once
    (CONFIG_INVALID): `railyard serve` checks them before it opens anything."""
    env = os.environ if environ is None else environ
    given = {name: env.get(name, "").strip() for name in SETTINGS}
    issuer = given["RAILYARD_OIDC_ISSUER"]
    if not issuer:
        stray = [name for name, value in given.items() if value]
        if stray:
            raise RailyardError(
                f"{', '.join(stray)} set but RAILYARD_OIDC_ISSUER is not: set it to the provider's issuer URL, or"
                " unset the others",
                code=Code.CONFIG_INVALID,
            )
        return None
    problems: list[str] = []
    if problem := _url_problem("RAILYARD_OIDC_ISSUER", issuer):
        problems.append(problem)
    client_id = given["RAILYARD_OIDC_CLIENT_ID"]
    if not client_id:
        problems.append("RAILYARD_OIDC_CLIENT_ID is required: the client id this server has at the provider")
    scopes = given["RAILYARD_OIDC_SCOPES"] or DEFAULT_SCOPES
    if "openid" not in scopes.split():
        problems.append(f"RAILYARD_OIDC_SCOPES must include openid: {scopes[:200]!r}")
    redirect = given["RAILYARD_OIDC_REDIRECT_URI"] or None
    if redirect is not None:
        if problem := _url_problem("RAILYARD_OIDC_REDIRECT_URI", redirect):
            problems.append(problem)
        elif urlsplit(redirect).path != CALLBACK_PATH:
            problems.append(f"RAILYARD_OIDC_REDIRECT_URI must end in {CALLBACK_PATH}: {redirect[:200]!r}")
    for name in ("RAILYARD_OIDC_GROUPS_CLAIM", "RAILYARD_OIDC_ACTOR_CLAIM"):
        if any(c.isspace() for c in given[name]):
            problems.append(f"{name} must be a claim's name, without spaces: {given[name][:100]!r}")
    groups_file = given["RAILYARD_OIDC_GROUPS_FILE"]
    groups: GroupMap | None = None
    if not groups_file:
        problems.append("RAILYARD_OIDC_GROUPS_FILE is required: the file mapping the provider's groups to roles")
    else:
        try:
            groups = read_groups(groups_file)
        except RailyardError as error:
            problems.append(error.message)
    if problems or groups is None:
        raise RailyardError("OpenID Connect: " + "; ".join(problems), code=Code.CONFIG_INVALID)
    return OidcSettings(
        issuer=issuer,
        client_id=client_id,
        groups=groups,
        client_secret=env.get("RAILYARD_OIDC_CLIENT_SECRET") or None,
        groups_claim=given["RAILYARD_OIDC_GROUPS_CLAIM"] or DEFAULT_GROUPS_CLAIM,
        actor_claim=given["RAILYARD_OIDC_ACTOR_CLAIM"] or DEFAULT_ACTOR_CLAIM,
        scopes=scopes,
        redirect_uri=redirect,
        name=given["RAILYARD_OIDC_NAME"][:100],
    )


# -- refusals ----------------------------------------------------------------------------------------------------
def refused(message: str, reason: str, **details: Any) -> Refused:
    """A sign-in refused: OIDC_REFUSED, `reason` one word a test or a log reader can branch on."""
    return Refused(f"sign-in refused: {message}", code=Code.OIDC_REFUSED, reason=reason, **details)


def unavailable(message: str, **details: Any) -> RailyardError:
    return RailyardError(f"the OpenID Connect provider {message}", code=Code.OIDC_UNAVAILABLE, **details)


# -- the provider ------------------------------------------------------------------------------------------------
class Provider:
    """The provider's discovery document and keys, fetched when first needed and kept (thread-safe)."""

    def __init__(self, settings: OidcSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = float("-inf")
        self._keys: KeySet | None = None
        self._keys_at = float("-inf")
        self._http = httpx.Client(timeout=HTTP_TIMEOUT_SECONDS, follow_redirects=False)

    def _get(self, url: str, what: str) -> dict[str, Any]:
        try:
            response = self._http.get(url)
        except httpx.HTTPError as exc:
            raise unavailable(f"did not answer for its {what} at {url}: {exc}"[:300], url=url) from None
        if response.status_code != 200:
            raise unavailable(f"answered {response.status_code} for its {what} at {url}", url=url)
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise unavailable(f"answered no JSON object for its {what} at {url}", url=url)
        return doc

    def metadata(self) -> dict[str, Any]:
        """The discovery document, checked: the issuer is the configured one, and it names the endpoints the code
        flow needs (OIDC_UNAVAILABLE if not)."""
        with self._lock:
            if self._metadata is not None and self._clock() - self._metadata_at < METADATA_SECONDS:
                return self._metadata
        url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
        doc = self._get(url, "discovery document")
        problems = metadata_problems(doc, self.settings.issuer)
        if problems:
            raise unavailable(
                f"discovery document at {url} is unusable: " + "; ".join(problems), url=url, unusable=True
            )
        with self._lock:
            self._metadata, self._metadata_at = doc, self._clock()
        return doc

    def keys(self, *, refresh: bool = False) -> KeySet:
        """The provider's public keys (its JWKS). `refresh`: fetch them again (a token named a key not seen yet),
        at most once every KEYS_REFETCH_SECONDS."""
        with self._lock:
            fresh = self._clock() - self._keys_at < KEYS_REFETCH_SECONDS
            if self._keys is not None and (not refresh or fresh):
                return self._keys
        url = str(self.metadata()["jwks_uri"])
        doc = self._get(url, "keys (jwks_uri)")
        try:
            keys = KeySet.import_key_set(doc)  # type: ignore[arg-type]
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            raise unavailable(f"published keys at {url} that do not read as a JWK set: {exc}"[:300], url=url) from None
        with self._lock:
            self._keys, self._keys_at = keys, self._clock()
        return keys

    def algorithms(self) -> list[str]:
        """The signature algorithms an ID token may use: what the provider says it signs with, of `ASYMMETRIC`."""
        named = self.metadata().get("id_token_signing_alg_values_supported") or ["RS256"]
        return [alg for alg in ASYMMETRIC if alg in named]


def metadata_problems(doc: Mapping[str, Any], issuer: str) -> list[str]:
    """Why a discovery document cannot serve this sign-in (OpenID Connect Discovery 1.0, section 4.3)."""
    problems: list[str] = []
    if str(doc.get("issuer", "")).rstrip("/") != issuer.rstrip("/"):
        problems.append(f"its issuer is {str(doc.get('issuer'))[:200]!r}, not {issuer!r}")
    for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
        value = doc.get(key)
        if not isinstance(value, str) or urlsplit(value).scheme not in ("https", "http"):
            problems.append(f"it names no {key}")
    methods = doc.get("code_challenge_methods_supported")
    if isinstance(methods, list) and "S256" not in methods:
        problems.append("it does not offer PKCE with S256 (code_challenge_methods_supported)")
    algorithms = doc.get("id_token_signing_alg_values_supported") or ["RS256"]
    if not isinstance(algorithms, list) or not set(algorithms) & set(ASYMMETRIC):
        problems.append(f"it signs ID tokens with none of {', '.join(ASYMMETRIC)}")
    return problems


# -- the ID token --------------------------------------------------------------------------------------------
_CLAIM_REASONS = {"aud": "audience", "azp": "audience", "iss": "issuer", "nonce": "nonce", "exp": "expired"}


def validate_id_token(
    id_token: str,
    *,
    keys: KeySet,
    issuer: str,
    client_id: str,
    nonce: str,
    algorithms: Iterable[str] = ("RS256",),
    access_token: str | None = None,
    now: float | None = None,
    leeway: int = LEEWAY_SECONDS,
) -> dict[str, Any]:
    """The ID token's claims once its signature (one of `keys`, one of `algorithms`), `iss`, `aud` (and `azp`),
    `exp`, `iat`, `nonce` and `at_hash` hold; else OIDC_REFUSED with `reason` one of signature, key, algorithm,
    malformed, issuer, audience, expired, nonce, claims."""
    try:
        token = jwt.decode(id_token, keys, algorithms=list(algorithms))
    except BadSignatureError:
        raise refused("the ID token's signature does not verify with the provider's keys", "signature") from None
    except (InvalidKeyIdError, MissingKeyError):
        raise refused("the ID token is signed with a key the provider does not publish", "key") from None
    except UnsupportedAlgorithmError:
        raise refused(
            f"the ID token is signed with an algorithm not allowed here ({', '.join(algorithms)})", "algorithm"
        ) from None
    except (JoseError, ValueError, TypeError) as exc:
        raise refused(f"the ID token does not read as a signed JWT ({type(exc).__name__})", "malformed") from None
    options: dict[str, Any] = {
        "iss": {"essential": True, "value": issuer},
        "aud": {"essential": True, "value": client_id},
        "sub": {"essential": True},
        "exp": {"essential": True},
        "iat": {"essential": True},
        "nonce": {"essential": True, "value": nonce},
    }
    claims = CodeIDToken(
        token.claims, token.header, options, {"nonce": nonce, "client_id": client_id, "access_token": access_token}
    )
    try:
        claims.validate(now=int(time.time() if now is None else now), leeway=leeway)
    except ExpiredTokenError:
        raise refused("the ID token has expired", "expired") from None
    except ClaimError as error:
        reason = _CLAIM_REASONS.get(error.claim, "claims")
        said = token.claims.get(error.claim)
        if reason == "audience":
            message = f"the ID token is for another audience ({str(said)[:100]!r}), not this server ({client_id!r})"
        elif reason == "issuer":
            message = f"the ID token was issued by {str(said)[:100]!r}, not {issuer!r}"
        elif reason == "nonce":
            message = "the ID token's nonce is not the one this browser's sign-in sent"
        else:
            message = f"the ID token's {error.claim!r} claim does not hold ({error.description})"
        raise refused(message, reason, claim=error.claim) from None
    except (JoseError, ValueError, TypeError) as exc:
        raise refused(f"the ID token's claims do not hold ({type(exc).__name__})", "claims") from None
    return dict(claims)


# -- who the token says signed in ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Identity:
    """A person the provider vouched for, and what the groups file gives them."""

    issuer: str
    subject: str
    actor: str
    groups: tuple[str, ...]
    roles: frozenset[str]
    tenants: frozenset[str] | None


def claim(claims: Mapping[str, Any], name: str) -> Any:
    """The claim `name`, else the nested one it names with dots (`realm_access.roles`); None if neither."""
    if name in claims:
        return claims[name]
    found: Any = claims
    for part in name.split("."):
        if not isinstance(found, Mapping) or part not in found:
            return None
        found = found[part]
    return found


def identity(claims: Mapping[str, Any], settings: OidcSettings) -> Identity:
    """The person validated claims name: the actor claim (else `sub`), their groups, and what those map to."""
    subject = str(claims.get("sub", ""))
    named = claim(claims, settings.actor_claim)
    actor = named if isinstance(named, str) and named else subject
    if not actor or name_problem(actor) is not None:
        raise refused(
            f"the provider names this person {actor[:60]!r} ({settings.actor_claim}, else sub), which is not a name"
            " Railyard can record as an actor (letters, digits and _ . @ + -, at most 200, no spaces)",
            "actor",
        )
    raw = claim(claims, settings.groups_claim)
    if raw is None:
        groups: list[str] = []
    elif isinstance(raw, str):
        groups = [raw]
    elif isinstance(raw, list) and all(isinstance(g, str) for g in raw):
        groups = list(raw)
    else:
        raise refused(f"the ID token's {settings.groups_claim!r} claim is not a list of group names", "claims")
    access = settings.groups.access(groups)
    return Identity(str(claims["iss"]), subject, actor, tuple(groups), access.roles, access.tenants)


# -- the sign-in ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Flow:
    """One browser's sign-in in progress: what the callback checks the provider's answer against."""

    state: str
    nonce: str
    verifier: str
    redirect_uri: str
    next: str

    def to_cookie(self) -> dict[str, str]:
        return {"s": self.state, "n": self.nonce, "v": self.verifier, "r": self.redirect_uri, "x": self.next}

    @classmethod
    def from_cookie(cls, doc: Mapping[str, Any] | None) -> Flow | None:
        if doc is None:
            return None
        values = [doc.get(k) for k in ("s", "n", "v", "r", "x")]
        texts = [v for v in values if isinstance(v, str)]
        return cls(*texts) if len(texts) == len(values) else None


class OidcClient:
    """The sign-in: `begin` gives the provider's authorization URL and the flow to keep in the browser's cookie;
    `finish` checks what the provider sent back and answers who signed in."""

    def __init__(self, settings: OidcSettings, provider: Provider | None = None) -> None:
        self.settings = settings
        self.provider = provider or Provider(settings)

    def _client(self, auth_method: str = "none") -> OAuth2Client:
        return OAuth2Client(
            client_id=self.settings.client_id,
            client_secret=self.settings.client_secret,
            token_endpoint_auth_method=auth_method,
            scope=self.settings.scopes,
            code_challenge_method="S256",
            timeout=HTTP_TIMEOUT_SECONDS,
        )

    def redirect_uri(self, base_url: str) -> str:
        """Where the provider sends the browser back: the configured URI, else this server's callback."""
        return self.settings.redirect_uri or base_url.rstrip("/") + CALLBACK_PATH

    def begin(self, redirect_uri: str, next_path: str) -> tuple[str, Flow]:
        """The authorization URL to send the browser to (code flow, PKCE S256, state and nonce) and its flow."""
        endpoint = str(self.provider.metadata()["authorization_endpoint"])
        flow = Flow(
            state=secrets.token_urlsafe(24),
            nonce=secrets.token_urlsafe(24),
            verifier=secrets.token_urlsafe(48),  # 64 characters: within RFC 7636's 43 to 128
            redirect_uri=redirect_uri,
            next=next_path,
        )
        with self._client() as client:
            url, _state = client.create_authorization_url(
                endpoint, state=flow.state, code_verifier=flow.verifier, nonce=flow.nonce, redirect_uri=redirect_uri
            )
        return str(url), flow

    def _auth_method(self) -> str:
        if self.settings.client_secret is None:
            return "none"
        offered = self.provider.metadata().get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        return "client_secret_post" if "client_secret_basic" not in offered else "client_secret_basic"

    def finish(self, flow: Flow | None, params: Mapping[str, str]) -> Identity:
        """Who signed in, from the provider's answer (`params`: the callback's query) and this browser's `flow`."""
        if flow is None:
            raise refused(
                "this browser has no sign-in in progress (it took longer than ten minutes, or the cookie was lost)",
                "state",
            )
        state = params.get("state") or ""
        if not secrets.compare_digest(state.encode(), flow.state.encode()):
            raise refused("the provider's answer is for another sign-in than this browser's (state)", "state")
        if params.get("error"):
            said = f"{params['error']}: {params.get('error_description', '')}".strip(": ")
            raise refused(f"the provider refused: {said[:200]}", "provider", error=params["error"][:100])
        code = params.get("code")
        if not code:
            raise refused("the provider's answer carries no code", "code")
        token_endpoint = str(self.provider.metadata()["token_endpoint"])
        try:
            with self._client(self._auth_method()) as client:
                token = client.fetch_token(
                    token_endpoint,
                    grant_type="authorization_code",
                    code=code,
                    redirect_uri=flow.redirect_uri,
                    code_verifier=flow.verifier,
                )
        except OAuthError as error:
            raise refused(
                f"the provider would not exchange the code ({error.error}: {error.description or ''})"[:300], "code"
            ) from None
        except httpx.HTTPError as exc:
            raise unavailable(f"did not answer at its token endpoint: {exc}"[:300]) from None
        except ValueError:
            raise unavailable("answered its token endpoint with something that is not JSON") from None
        id_token = token.get("id_token") if isinstance(token, dict) else None
        if not isinstance(id_token, str):
            raise refused("the provider's token response carries no ID token (is openid in the scopes?)", "id_token")
        access_token = token.get("access_token")
        claims = self.validate(id_token, flow.nonce, access_token if isinstance(access_token, str) else None)
        return identity(claims, self.settings)

    def validate(self, id_token: str, nonce: str, access_token: str | None = None) -> dict[str, Any]:
        """`validate_id_token` with the provider's keys, fetched again once if the token names a key not seen."""
        metadata = self.provider.metadata()
        arguments: dict[str, Any] = {
            "issuer": str(metadata["issuer"]),
            "client_id": self.settings.client_id,
            "nonce": nonce,
            "algorithms": self.provider.algorithms(),
            "access_token": access_token,
        }
        try:
            return validate_id_token(id_token, keys=self.provider.keys(), **arguments)
        except Refused as error:
            if error.details.get("reason") != "key":
                raise
        return validate_id_token(id_token, keys=self.provider.keys(refresh=True), **arguments)

    def check(self) -> None:
        """At start: the provider's discovery document, fetched now. A document that contradicts the settings is
        CONFIG_INVALID; a provider that does not answer yet is OIDC_UNAVAILABLE (the caller decides)."""
        try:
            self.provider.metadata()
        except RailyardError as error:
            if error.details.get("unusable"):
                raise RailyardError(error.message, code=Code.CONFIG_INVALID) from None
            raise


# -- the person ------------------------------------------------------------------------------------------------
def sync_person(people: People, person: Identity, settings: OidcSettings) -> Person:
    """Make the people table say what the provider says of `person` (source oidc: exactly the roles and tenants
    their groups give, each change an access-trail entry by `oidc:<issuer host>`), and answer them if they may
    sign in; OIDC_REFUSED if not:

    - a person of that name who is not the provider's (a local one, managed with `railyard users`; or the same
      name in another letter case) is never taken over (`name_taken`);
    - a person disabled in Railyard stays disabled (`disabled`): the provider's word does not enable them;
    - with tenants in use (a groups file that names any), a person whose groups name none is refused
      (`no_tenant`): the people table cannot confine anyone to nothing. If they signed in before, their roles are
      taken away first (their tenants stay as they were), so the sessions they still have lose them too.
    """
    if person.tenants is not None and not person.tenants:
        known = people.get(person.actor)
        if known is not None and known.source is Source.OIDC and known.roles:
            people.sync_external(person.actor, (), known.tenants, source=Source.OIDC, by=settings.by)
        raise refused(
            f"the groups of {person.actor!r} give them no tenant here: ask for one of the groups that do",
            "no_tenant",
        )
    try:
        outcome = people.sync_external(person.actor, person.roles, person.tenants, source=Source.OIDC, by=settings.by)
    except Refused as error:
        if error.code is Code.USER_EXISTS:
            raise refused(
                f"{person.actor!r} is a name Railyard already gives someone who does not sign in through"
                f" {settings.display_name} ({error.message})",
                "name_taken",
            ) from None
        raise
    except RailyardError as error:  # USAGE_INVALID: a name or role the people table does not accept
        raise refused(error.message, "claims") from None
    if outcome.person.disabled:
        raise refused(f"{person.actor!r} is disabled here", "disabled")
    return outcome.person
