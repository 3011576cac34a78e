"""EC2's error codes mapped to the provider error family. boto3 raises ``ClientError`` with
EC2's code (``Response.Errors.Error.Code``) for every refusal, and its own ``BotoCoreError``s
for transport failures; nothing of boto3 leaves the adapter."""

from __future__ import annotations

from collections.abc import Mapping

from providers.aws.api import TARGET
from providers.errors import (
    InstanceNotFound,
    InvalidCredentials,
    NoCapacity,
    PermanentProviderError,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)

# EC2's code -> what it means to the control plane.
ERROR_CODES: Mapping[str, type[ProviderError]] = {
    # The key is wrong, expired, lacks an IAM permission, or the region is not enabled.
    "AuthFailure": InvalidCredentials,
    "UnauthorizedOperation": InvalidCredentials,
    "InvalidClientTokenId": InvalidCredentials,
    "SignatureDoesNotMatch": InvalidCredentials,
    "ExpiredToken": InvalidCredentials,
    "OptInRequired": InvalidCredentials,
    "PendingVerification": InvalidCredentials,
    "Blocked": InvalidCredentials,
    # AWS has no machine of that kind now, there or at that price: another offer may work.
    "InsufficientInstanceCapacity": NoCapacity,
    "InsufficientHostCapacity": NoCapacity,
    "InsufficientCapacity": NoCapacity,
    "UnfulfillableCapacity": NoCapacity,
    "InsufficientFreeAddressesInSubnet": NoCapacity,
    "SpotMaxPriceTooLow": NoCapacity,
    # The account's limit on spot instances of the type: EC2 counts it per region and market,
    # so an on-demand offer or another region may still be rented (as ParallelCluster fails
    # over on it); its message says it is a limit.
    "MaxSpotInstanceCountExceeded": NoCapacity,
    "Unsupported": NoCapacity,  # the type is not sold in the zone EC2 picked
    # The account's quota, not a shortage at AWS: the operator must act (QuotaExceeded stops
    # the launch at the first offer: the others are on the same account).
    "VcpuLimitExceeded": QuotaExceeded,
    "InstanceLimitExceeded": QuotaExceeded,
    # Throttled (EC2 uses a token bucket per action); boto3 retried a few times already.
    "RequestLimitExceeded": RateLimited,
    "Throttling": RateLimited,
    "ThrottlingException": RateLimited,
    # EC2's own failures: usually pass.
    "InternalError": TransientProviderError,
    "InternalFailure": TransientProviderError,
    "ServiceUnavailable": TransientProviderError,
    "Unavailable": TransientProviderError,
    # An instance EC2 does not know (terminated long ago, another account): cancel succeeds.
    "InvalidInstanceID.NotFound": InstanceNotFound,
    "InvalidInstanceID.Malformed": InstanceNotFound,
}

_HINTS: Mapping[str, str] = {
    "VcpuLimitExceeded": (
        " (the AWS account's vCPU quota for this instance family is used up, not a shortage "
        "at AWS: ask AWS to raise it in Service Quotas, or end other instances)"
    ),
    "InstanceLimitExceeded": (
        " (the AWS account's instance quota is used up, not a shortage at AWS: ask AWS to "
        "raise it in Service Quotas, or end other instances)"
    ),
    "MaxSpotInstanceCountExceeded": " (the AWS account's spot instance limit for this type)",
    "UnauthorizedOperation": (
        " (the key works but its IAM policy lacks this EC2 action: docs/PROVIDERS.md, "
        "IAM policy, lists the permissions trainhub needs)"
    ),
    "OptInRequired": " (the region is not enabled for this AWS account)",
    "IdempotentParameterMismatch": (
        " (EC2 already launched an instance with this attempt's client token and other "
        "parameters; it is found by its tags at the next try)"
    ),
}


def translate(exc: Exception, *, action: str, launching: bool = False) -> ProviderError:
    """The family member a boto3/botocore exception stands for. ``launching``: the call may
    have started a machine when its answer was lost (the caller must look before repeating:
    the ClientToken makes the repeat safe anyway)."""
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ClientError):
        error = exc.response.get("Error") or {}
        code = str(error.get("Code") or "")
        message = f"aws {action}: {code or 'error'}: {error.get('Message') or ''}".rstrip(": ")
        message += _HINTS.get(code, "")
        raw_status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        status = raw_status if isinstance(raw_status, int) else None
        body = {"Error": {"Code": code, "Message": str(error.get("Message") or "")}}
        kind = ERROR_CODES.get(code)
        if kind is None:
            if status is not None and status >= 500:
                kind = TransientProviderError
            elif status in (401, 403):
                kind = InvalidCredentials
            elif status == 429:
                kind = RateLimited
            else:
                kind = PermanentProviderError
        if kind is TransientProviderError:
            return TransientProviderError(
                message,
                maybe_applied=launching,
                provider=TARGET,
                status=status,
                code=code,
                body=body,
            )
        return kind(message, provider=TARGET, status=status, code=code, body=body)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return InvalidCredentials(
            f"aws {action}: no AWS credentials ({exc}): add an 'aws' credential with "
            "access_key_id and secret_access_key, or give the control plane an instance role",
            provider=TARGET,
        )
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
        # The connection never opened: nothing can have started.
        return TransientProviderError(f"aws {action}: {exc}", provider=TARGET)
    return TransientProviderError(f"aws {action}: {exc}", provider=TARGET, maybe_applied=launching)
