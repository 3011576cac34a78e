"""The one error family every provider adapter raises; callers never see ``requests`` errors.

The control plane decides from the class alone: retry later (RateLimited, Transient), try
another offer (NoCapacity), stop and tell the user (InvalidCredentials, Permanent), treat as
done (InstanceNotFound on cancel), or wait (NotYetTerminated).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the contract's dataclasses; base imports nothing of this module
    from providers.base import LaunchRequest, Offer


class ProviderError(Exception):
    """A provider call failed. ``message`` is safe to show and log: no key, no signed URL."""

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status: int | None = None,
        code: str = "",
        body: object = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.status = status
        self.code = code  # the provider's machine-readable error code, where it sends one
        self.body = body  # the decoded JSON error body (a Vast create error may name an id)


class InvalidCredentials(ProviderError):
    """401, or 403: the key is wrong, revoked or lacks the scope the call needs."""


class NoCapacity(ProviderError):
    """No machine of the asked kind is available now; another offer or a later try may work."""

    retryable = True


class RateLimited(ProviderError):
    """The provider (or our own limiter) refused the call for now."""

    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.retry_after = retry_after


class TransientProviderError(ProviderError):
    """5xx, a timeout or a dropped connection. ``maybe_applied``: the request may have taken
    effect before it failed (a launch that timed out may have started a paid machine), so the
    caller must look before doing it again."""

    retryable = True

    def __init__(self, message: str, *, maybe_applied: bool = False, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.maybe_applied = maybe_applied


class PermanentProviderError(ProviderError):
    """A 4xx the same request will get again (a bad payload, an unknown GPU type, no balance)."""


class QuotaExceeded(PermanentProviderError):
    """The account's own quota (instances, GPUs, spend) is used up: not a shortage at the
    provider. Another offer on the same account gets the same answer, so a launch stops at the
    first one rather than trying each (NoCapacity would try the next offer and remember this
    one as sold out); it works again once the quota is raised or other machines end."""


class InstanceNotFound(PermanentProviderError):
    """The provider does not know the instance or job (404): for ``cancel``, that is success."""


class NotYetTerminated(ProviderError):
    """A termination was accepted but has not finished; poll again."""

    retryable = True


def vm_launch_target(request: LaunchRequest, target: str, provider: str) -> tuple[Offer, str, str]:
    """The offer a VM launch rents with its ``<instance type>@<region>`` parts, after checking
    the request carries one of ``target``'s offers and the attempt's SSH key."""
    offer = request.offer
    type_name, _, region = (offer.offer_id if offer else "").partition("@")
    if offer is None or offer.target != target or not type_name or not region:
        got = f"{offer.target} offer {offer.offer_id!r}" if offer else "no offer"
        raise PermanentProviderError(
            f"a {provider} launch rents one offer: the request must carry an available "
            f"{provider} offer '<instance type>@<region>' from offers(); it has {got}",
            provider=target,
        )
    if not request.ssh_public_key:
        raise PermanentProviderError(
            f"{provider} launches need the attempt's SSH public key", provider=target
        )
    return offer, type_name, region
