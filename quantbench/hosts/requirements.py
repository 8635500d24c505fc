"""A variant's session requirement (its recipe's ``session_requirements``) merged into a host's session.

Every run of a variant that requires session config entries runs under its host's session with those entries
added, for that variant only. The entries the host's own session did not set are named in the session's
``required_entries`` option (among its config entries too), so the session recorded with a result is the
session actually used, its key differs from the host's (a result computed without the requirement is never
reused for it), and the host's own session is recovered from it exactly (host_session): the analysis selects a
host's results by the host's session. A host whose own session sets a required key to another value cannot run
the variant (applied raises RequirementConflict: a result, never a silent override).
"""

from __future__ import annotations

import dataclasses
import json

from quantbench.errors import UserError
from quantbench import worker
from quantbench.hosts.keys import session_key, session_options
from quantbench.inputs.sidecarfile import requirements_of

REQUIRED = worker.REQUIRED


class RequirementConflict(UserError):
    """The host's own session sets a key the variant requires to another value."""


def entries_text(required: dict) -> str:
    """'session.x64quantprecision=1, ...' ('' for none)."""
    return ", ".join(f"{k}={v}" for k, v in sorted(required.items()))


def applied(session: dict, required: dict) -> dict:
    """`session` (a host's) with the `required` entries added: the session the variant runs under there (the
    host's own, unchanged, when it sets them all already)."""
    s = session_options(session)
    own = s["config_entries"]
    clash = {k: v for k, v in required.items() if k in own and own[k] != v}
    if clash:
        raise RequirementConflict("its session sets " + entries_text({k: own[k] for k in clash}) + "; the variant "
                                  f"requires {entries_text(clash)}")
    return s.required({k: v for k, v in required.items() if k not in own}).wire()


def for_variant(session: dict, variant) -> dict:
    """The session `variant` (anything with a recipe) runs under on a host whose session is `session`."""
    return applied(session, requirements_of(variant))


def host_session(session: dict) -> dict:
    """The host's own session of a session a variant ran under (applied's inverse)."""
    return session_options(session).own().wire()


def host_key(session_options: str, skey: str) -> str:
    """The key of the host's own session of a result recorded under `session_options` (JSON) and key `skey`."""
    if REQUIRED not in (session_options or ""):
        return skey
    return session_key(host_session(json.loads(session_options)))


def added_entries(session_options: str) -> dict:
    """The entries a variant's requirement added to its host's session, of a result's `session_options` (JSON)."""
    if REQUIRED not in (session_options or ""):
        return {}
    return dict(json.loads(session_options).get(REQUIRED) or {})


def ran_as(session_options: str, required: dict) -> bool:
    """Whether a result recorded under `session_options` (JSON) is one of a variant that requires `required`: its
    session sets every required entry (a variant without one: no entry was added for a requirement). The same model
    run under another requirement, or without it, is another deployment's result."""
    if not required:
        return REQUIRED not in (session_options or "")
    entries = json.loads(session_options or "{}").get("config_entries") or {}
    return all(entries.get(k) == v for k, v in required.items())


def for_hosts(hosts: list, variant) -> list:
    """`hosts` (registry.HostRequests) with `variant`'s session requirement added to each one's session (the
    explain commands run one variant on them); a host whose own session contradicts it is an error naming it."""
    required = requirements_of(variant)
    if not required:
        return list(hosts)
    out = []
    for h in hosts:
        try:
            out.append(dataclasses.replace(h, session=applied(h.session, required)))
        except RequirementConflict as exc:
            raise UserError(f"host {h.label}: variant {variant.name}'s session requirement {entries_text(required)} "
                            f"cannot be applied: {exc}") from None
    return out
