/**
 * Cloud instance metadata endpoints: they hand out the host's credentials to whoever asks, so
 * they are refused even when an operator's exception CIDR covers them.
 */
export const CLOUD_METADATA_ADDRESSES: readonly string[] = [
  '169.254.169.254', // AWS IMDS, GCP, Azure IMDS, Oracle, DigitalOcean, Hetzner, OpenStack
  'fd00:ec2::254', // AWS IMDS over IPv6 (Nitro)
  '169.254.170.2', // AWS ECS task metadata and credentials
  '169.254.170.23', // AWS EKS Pod Identity agent
  'fd00:ec2::23', // AWS EKS Pod Identity agent over IPv6
  '168.63.129.16', // Azure WireServer (a public address, so only this list catches it)
  '192.0.0.192', // Oracle Cloud legacy metadata
  '100.100.100.200', // Alibaba Cloud metadata
];

/**
 * Names that point at a metadata service on the cloud they run on. Resolution would catch them
 * too (they resolve to the addresses above); refusing the name as well keeps a stray exception
 * CIDR or split-horizon DNS from letting them through.
 */
export const CLOUD_METADATA_HOSTS: readonly string[] = [
  'metadata.google.internal',
  'metadata.goog',
  'metadata',
  'instance-data',
  'instance-data.ec2.internal',
  'metadata.tencentyun.com',
];
