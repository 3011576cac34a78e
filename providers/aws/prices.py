"""On-demand prices of the GPU instance types trainhub rents on EC2, USD per hour for Linux.

EC2's own API has no price call: list prices live in the separate Pricing service (a bulk
catalogue, us-east-1 and ap-south-1 endpoints only, its own IAM action). trainhub keeps the
prices of the types it offers here instead, from AWS's public on-demand price list for
us-east-1 (checked 2026; p4d/p5 after the June 2025 price cut). They differ a little by region
and change now and then: the operator overrides them with ``TRAINHUB_AWS_PRICES``
(``g5.xlarge=1.006,p5.48xlarge@us-west-2=55.04``; ``<type>@<region>`` beats ``<type>``).
A type without a price is not offered: a job's price cap could not be checked against it.
Spot prices are not in here: they come from ``DescribeSpotPriceHistory`` at every offers call.
"""

from __future__ import annotations

from collections.abc import Mapping

ON_DEMAND_USD_PER_HOUR: Mapping[str, float] = {
    # G5: NVIDIA A10G (24 GB)
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g5.4xlarge": 1.624,
    "g5.8xlarge": 2.448,
    "g5.12xlarge": 5.672,
    "g5.16xlarge": 4.096,
    "g5.24xlarge": 8.144,
    "g5.48xlarge": 16.288,
    # G6: NVIDIA L4 (24 GB)
    "g6.xlarge": 0.8048,
    "g6.2xlarge": 0.9776,
    "g6.4xlarge": 1.3232,
    "g6.8xlarge": 2.0144,
    "g6.12xlarge": 4.6016,
    "g6.16xlarge": 3.3968,
    "g6.24xlarge": 6.6752,
    "g6.48xlarge": 13.3504,
    # G6e: NVIDIA L40S (48 GB)
    "g6e.xlarge": 1.861,
    "g6e.2xlarge": 2.242,
    "g6e.4xlarge": 3.004,
    "g6e.8xlarge": 4.529,
    "g6e.12xlarge": 10.493,
    "g6e.16xlarge": 7.577,
    "g6e.24xlarge": 15.066,
    "g6e.48xlarge": 30.131,
    # P4d: 8x NVIDIA A100 40 GB; P5: 8x NVIDIA H100 80 GB
    "p4d.24xlarge": 21.958,
    "p5.48xlarge": 55.04,
}


def on_demand_price(
    instance_type: str, region: str, overrides: Mapping[str, float] | None = None
) -> float | None:
    """USD per hour of ``instance_type`` in ``region``; None when nobody knows it."""
    overrides = overrides or {}
    for key in (f"{instance_type}@{region}", instance_type):
        if key in overrides:
            return float(overrides[key])
    return ON_DEMAND_USD_PER_HOUR.get(instance_type)
