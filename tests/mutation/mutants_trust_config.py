"""Control-plane tokens as an operator writes them and as each request presents one (pass
of 2026-12-07, late: control/admin/auth.py had one planted bug); each has a test that fails
on it."""

from __future__ import annotations

from mutant_spec import SEC, Mutant

AUTH = "control/admin/auth.py"
TOKENS_T = SEC + "test_tokens_and_limits.py"
DOOR_T = SEC + "test_control_door.py"
YAML_T = TOKENS_T + "::test_a_yaml_token_the_server_would_misread_is_refused"
ENV_T = TOKENS_T + "::test_an_environment_token_list_the_server_would_misread_is_refused"
BEARER_T = TOKENS_T + "::test_only_a_bearer_header_with_a_known_secret_names_a_token"

TRUST_CONFIG_MUTANTS: list[Mutant] = [
    Mutant("token-short-secret-accepted", AUTH, "if len(secret) < 8:", "if len(secret) < 1:",
           (TOKENS_T,), "a 3-character control token is accepted: guessed in seconds"),
    Mutant("token-admin-bound-accepted", AUTH, '    if scope != "read":\n', "    if False:\n",
           (TOKENS_T,),
           "an admin token 'bound' to one tenant still changes the config every tenant runs"
           " under, and its operator believes it is confined"),
    Mutant("token-names-not-unique", AUTH, "    if len(set(names)) != len(names):",
           "    if False:", (YAML_T, ENV_T),
           "two tokens named alice: the audit cannot say which one made a change"),
    Mutant("token-env-tenant-after-unbound", AUTH,
           'if ":" not in piece and entries and len(entries[-1].split(":")) == 4:',
           'if ":" not in piece and entries:', (ENV_T,),
           "a stray name after an unbound read token in the variable binds it to a tenant"
           " nobody meant, instead of being refused"),
    Mutant("token-yaml-unknown-key-ignored", AUTH,
           'if not isinstance(item, dict) or set(item) - {"name", "scope", "secret", "tenants"}:',
           "if not isinstance(item, dict):", (YAML_T,),
           "a YAML token with `tenant: acme` (singular) is loaded unbound: it reads every"
           " tenant's requests"),
    Mutant("token-yaml-tenants-a-string", AUTH,
           "if tenants is not None and not isinstance(tenants, list):", "if False:",
           (YAML_T,),
           "`tenants: acme` binds the token to tenants a, c, m and e"),
    Mutant("token-file-comment-parsed", AUTH,
           'if ln and not ln.startswith("#")]', "if ln]", (TOKENS_T,),
           "a commented line in the tokens file stops the server from starting"),
    Mutant("trace-public-without-tokens", AUTH, "    if trace:\n        raise", "    if False:\n"
           "        raise", (TOKENS_T + "::test_serve_refuses_a_public_trace_without_tokens",),
           "`--host 0.0.0.0 --no-control-api --trace-db F` with no tokens serves every"
           " tenant's requests to anyone on the network"),
    Mutant("read-token-passes-admin", AUTH,
           'if scope == "admin" and token.scope != "admin":',
           'if scope == "admin" and token.scope not in SCOPES:', (DOOR_T,),
           "a read-only (Grafana) token changes the live config"),
    Mutant("bearer-scheme-unchecked", AUTH,
           'if kind.lower() != "bearer" or not secret:', "if not secret:", (BEARER_T,),
           "any scheme is taken as bearer: 'Basic <secret>' from a proxy's stale header"
           " authenticates"),
]
