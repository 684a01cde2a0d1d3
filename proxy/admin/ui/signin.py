"""Sign in with a memrelay key, pick a tenant, sign out.

The key is read from the form once, checked like an API request's key (KeyStore.check:
hash compared in constant time) and dropped: the cookie only refers to it by id. With no
keys file memrelay runs open (loopback only, as the CLI enforces) and the sign-in page
asks for a tenant alone, as the API takes any X-Memrelay-Tenant then.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from proxy.admin.ui.session import COOKIE, PRE_COOKIE, PREFIX
from proxy.admin.ui.web import Forbidden, form, one, page, redirect, signed_in
from proxy.edge.identity import ID_RULE, IdentityMissing, identity_of

if TYPE_CHECKING:
    from proxy.admin.ui.inspector import Inspector

_TENANT = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _cookie(response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path=PREFIX, secure=True, httponly=True, samesite="strict"
    )


async def form_page(
    ui: Inspector, request: Request, error: str = "", status: int = 200
) -> Response:
    try:
        identity_of(request.scope)
        if not error:
            return redirect(PREFIX + "/memories")
    except IdentityMissing:
        pass
    cookie, token = ui.sessions.pre_session()
    response = page(
        ui,
        request,
        "signin.html",
        status,
        signin_token=token,
        error=error,
        default_tenant=ui.settings.default_tenant,
    )
    _cookie(response, PRE_COOKIE, cookie, 1800)
    return response


async def sign_in(ui: Inspector, request: Request) -> Response:
    fields = await form(request)
    if not ui.sessions.pre_session_ok(request.scope["headers"], one(fields, "csrf")):
        raise Forbidden("the sign-in form expired or did not come from this page; try again")
    tenant = one(fields, "tenant").strip()
    if tenant and not _TENANT.fullmatch(tenant):
        return await form_page(ui, request, f"a tenant is {ID_RULE}", 400)
    if ui.sessions.keys.enforced:
        record = ui.sessions.keys.check(one(fields, "key").strip())
        if record is None:
            return await form_page(ui, request, "unknown or revoked key", 401)
        key_id: str | None = record.id
        if not tenant:
            tenant = record.tenants[0] if record.tenants else ui.settings.default_tenant
        if not record.allows(tenant):
            return await form_page(ui, request, "this key may not use that tenant", 403)
        several = record.admin or len(record.tenants) > 1
    else:
        key_id, tenant = None, tenant or ui.settings.default_tenant
        several = False
    value, _ = ui.sessions.start(key_id, tenant)
    response = redirect(PREFIX + ("/tenant" if several else "/memories"))
    _cookie(response, COOKIE, value, int(ui.sessions.lifetime))
    response.delete_cookie(PRE_COOKIE, path=PREFIX, secure=True, httponly=True, samesite="strict")
    return response


async def sign_out(ui: Inspector, request: Request) -> Response:
    _, session = signed_in(request)
    fields = await form(request)
    if not ui.sessions.csrf_ok(session, one(fields, "csrf")):
        raise Forbidden("this form did not come from your session")
    ui.sessions.end(session)
    response = redirect(PREFIX + "/signin")
    response.delete_cookie(COOKIE, path=PREFIX, secure=True, httponly=True, samesite="strict")
    return response


async def tenant_page(ui: Inspector, request: Request) -> Response:
    _, session = signed_in(request)
    return page(ui, request, "tenant.html", choices=ui.tenant_choices(session))


async def switch_tenant(ui: Inspector, request: Request) -> Response:
    _, session = signed_in(request)
    fields = await form(request)
    if not ui.sessions.csrf_ok(session, one(fields, "csrf")):
        raise Forbidden("this form did not come from your session")
    tenant = one(fields, "tenant").strip()
    if not _TENANT.fullmatch(tenant):
        raise Forbidden(f"a tenant is {ID_RULE}")
    if session.key_id is not None:
        record = ui.sessions.live(session.key_id)
        if record is None or not record.allows(tenant):
            raise Forbidden("this key may not use that tenant")
    value, _ = ui.sessions.start(session.key_id, tenant, sid=session.sid)
    response = redirect(PREFIX + "/memories")
    _cookie(response, COOKIE, value, int(ui.sessions.lifetime))
    return response
