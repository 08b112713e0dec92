"""The addresses the SSRF guard (``core.tools.fetch.resolve``: ``http_fetch``, a tool's credential
client, the egress proxy, the A2A client) never contacts, whatever name leads to them: loopback, private, link-local, shared/CGNAT, multicast,
unspecified, reserved, unique-local and site-local IPv6, IPv4-mapped, -compatible and -embedding
IPv6 forms, and the cloud metadata and credential endpoints by name (``refusal`` says which)."""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud metadata, credential and time/DNS endpoints, named so the refusal says what they are
# (each is also inside a range refused below).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS/GCP/Azure/OpenStack instance metadata
        "169.254.170.2",  # ECS task credentials (the Fargate worker's role)
        "169.254.170.23",  # EKS pod identity
        "169.254.169.253",  # Amazon DNS
        "169.254.169.123",  # Amazon time sync
        "fd00:ec2::254",  # AWS instance metadata over IPv6
        "fd00:ec2::23",  # EKS pod identity over IPv6
        "fd00:ec2::253",  # Amazon DNS over IPv6
        "100.100.100.200",  # Alibaba Cloud metadata
        "192.0.0.192",  # Oracle Cloud metadata
    )
)

# Ranges refused besides what ``ipaddress`` classifies: these either embed an IPv4 address a
# gateway would translate (so ``64:ff9b::7f00:1`` could mean 127.0.0.1) or are not unicast
# destinations anyone should fetch from.
EXTRA_REFUSED: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.ip_network(net), why)
    for net, why in (
        ("0.0.0.0/8", "the 'this network' range"),
        ("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("198.18.0.0/15", "benchmarking space"),
        ("::/96", "an IPv4-compatible IPv6 address"),
        ("::ffff:0:0/96", "an IPv4-mapped IPv6 address"),
        ("64:ff9b::/96", "a NAT64 address embedding an IPv4 address"),
        ("64:ff9b:1::/48", "a local-use NAT64 address"),
        ("2002::/16", "a 6to4 address embedding an IPv4 address"),
        ("2001::/32", "a Teredo address embedding an IPv4 address"),
        ("100::/64", "the IPv6 discard prefix"),
        ("fec0::/10", "a site-local IPv6 address"),
    )
)


def refusal(address: IPAddress) -> str | None:
    """Why ``address`` must not be contacted, or None for a public unicast address."""
    if address in METADATA_ADDRESSES:
        return "a cloud metadata or credentials endpoint"
    checks = (
        (address.is_loopback, "a loopback address"),
        (address.is_unspecified, "the unspecified address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
    )
    for hit, why in checks:
        if hit:
            return why
    for network, why in EXTRA_REFUSED:
        if address.version == network.version and address in network:
            return why
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address" if address.version == 4 else "a private or unique-local IPv6 address"
    if not address.is_global:
        return "not a public internet address"
    return None
