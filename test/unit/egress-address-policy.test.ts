import { describe, expect, it } from 'vitest';
import { createAddressPolicy } from '../../src/egress/address-policy.js';
import { CLOUD_METADATA_ADDRESSES } from '../../src/egress/cloud-metadata.js';

const strict = createAddressPolicy([]);

describe('address policy: public addresses pass', () => {
  it.each([
    // Public IPv4 from the `private-ip` npm package's test suite (frenchbread/private-ip, test.js, pub_ips).
    '44.37.112.180',
    '46.192.247.73',
    '71.12.102.112',
    '101.0.26.90',
    '111.211.73.40',
    '156.238.194.84',
    '164.101.185.82',
    '223.231.138.242',
    // Global unicast IPv6 from the same list, just outside 2001:db8::/32.
    '2000::',
    '2001:db7::',
    '2001:db9::',
  ])('admits %s', (address) => {
    expect(strict(address)).toEqual({ ok: true, address, family: address.includes(':') ? 6 : 4, excepted: false });
  });

  it('admits an IPv4-mapped public address as the IPv4 address it carries (ipaddr.process semantics)', () => {
    expect(strict('::ffff:8.8.8.8')).toEqual({ ok: true, address: '8.8.8.8', family: 4, excepted: false });
  });

  it('admits NAT64 of a public address, which is what a DNS64 network answers for public hosts', () => {
    // private-ip (test.js, priv_ips) lists 64:ff9b::16.10.11.1 as private: it refuses all of NAT64.
    // We judge the carried address instead, so IPv6-only sites behind DNS64 keep working.
    expect(strict('64:ff9b::16.10.11.1')).toMatchObject({ ok: true });
  });

  it('admits 6to4 and Teredo forms that carry public addresses', () => {
    expect(strict('2002:808:808::1')).toMatchObject({ ok: true }); // 6to4 of 8.8.8.8
    // Teredo: server 65.54.227.120, client 8.8.8.8 stored inverted as f7f7:f7f7 (RFC 4380 §4).
    expect(strict('2001:0:4136:e378:8000:63bf:f7f7:f7f7')).toMatchObject({ ok: true });
  });
});

describe('address policy: every non-public class is refused', () => {
  it.each([
    ['127.0.0.1', 'loopback'],
    ['127.255.255.254', 'loopback'],
    ['::1', 'loopback'],
    ['0.0.0.0', 'unspecified'],
    ['::', 'unspecified'],
    ['0.1.2.3', 'this_network'],
    ['10.0.0.1', 'private'],
    ['172.16.0.1', 'private'],
    ['172.31.255.255', 'private'],
    ['192.168.1.1', 'private'],
    ['100.64.0.1', 'carrier_grade_nat'],
    ['100.127.255.254', 'carrier_grade_nat'],
    ['169.254.1.1', 'link_local'],
    ['fe80::1', 'link_local'],
    ['fe80::1%eth0', 'link_local'],
    ['fc00::1', 'unique_local'],
    ['fd12:3456::1', 'unique_local'],
    ['fec0::1', 'site_local'],
    ['224.0.0.1', 'multicast'],
    ['239.255.255.250', 'multicast'],
    ['ff02::1', 'multicast'],
    ['255.255.255.255', 'broadcast'],
    ['240.0.0.1', 'reserved'],
    ['192.0.0.8', 'reserved'],
    ['192.88.99.1', 'reserved'],
    ['198.18.0.1', 'benchmarking'],
    ['198.19.255.255', 'benchmarking'],
    ['2001:2::1', 'benchmarking'],
    ['192.0.2.1', 'documentation'],
    ['198.51.100.1', 'documentation'],
    ['203.0.113.1', 'documentation'],
    ['2001:db8::1', 'documentation'],
    ['3fff::1', 'documentation'],
    ['100::1', 'discard'],
    ['::ffff:0:7f00:1', 'ipv4_translated'],
    ['64:ff9b:1::1', 'nat64_local_use'],
    ['5f00::1', 'not_global_unicast'], // SRv6 SIDs, outside 2000::/3
    ['99::', 'not_global_unicast'],
  ])('refuses %s as %s', (address, classification) => {
    expect(strict(address)).toMatchObject({ ok: false, address, classification });
  });

  it('refuses what only ipaddr.js knows as special (its range table is the second opinion)', () => {
    expect(strict('192.175.48.1')).toMatchObject({ ok: false, classification: 'special_purpose', range: 'as112' });
    expect(strict('192.52.193.1')).toMatchObject({ ok: false, classification: 'special_purpose', range: 'amt' });
    expect(strict('2620:4f:8000::1')).toMatchObject({ ok: false, classification: 'special_purpose', range: 'as112v6' });
  });

  it('refuses IPv4-compatible forms, which ipaddr.js itself calls unicast', () => {
    expect(strict('::7f00:1')).toMatchObject({ ok: false, classification: 'ipv4_compatible' }); // ::127.0.0.1
    expect(strict('::808:808')).toMatchObject({ ok: false, classification: 'ipv4_compatible' }); // ::8.8.8.8
  });

  it('refuses every private address of the private-ip test suite', () => {
    // frenchbread/private-ip, test.js, priv_ips (the NAT64 public entry is discussed above).
    const privIps = [
      '0.0.0.0',
      '0000.0000.0000.0000',
      '0000.0000',
      '0.0.0.1',
      '0.0.0.7',
      '0.0.0.255',
      '0.0.255.255',
      '0.1.255.255',
      '0.15.255.255',
      '0.63.255.255',
      '0.255.255.254',
      '0.255.255.255',
      '10.0.0.0',
      '10.0.0.1',
      '10.0.0.01',
      '10.0.0.001',
      '10.255.255.254',
      '10.255.255.255',
      '100.64.0.0',
      '100.64.0.1',
      '100.127.255.254',
      '100.127.255.255',
      '127.0.0.0',
      '127.0.0.1',
      '127.0.0.01',
      '127.255.255.254',
      '127.255.255.255',
      '169.254.0.0',
      '169.254.0.1',
      '169.254.255.254',
      '169.254.255.255',
      '172.16.0.0',
      '172.16.0.1',
      '172.16.0.001',
      '172.31.255.254',
      '172.31.255.255',
      '192.0.0.0',
      '192.0.0.1',
      '192.0.0.6',
      '192.0.0.7',
      '192.0.0.8',
      '192.0.0.9',
      '192.0.0.10',
      '192.0.0.11',
      '192.0.0.170',
      '192.0.0.171',
      '192.0.0.254',
      '192.0.0.255',
      '192.0.2.0',
      '192.0.2.1',
      '192.0.2.254',
      '192.0.2.255',
      '192.31.196.0',
      '192.31.196.1',
      '192.31.196.254',
      '192.31.196.255',
      '192.52.193.0',
      '192.52.193.1',
      '192.52.193.254',
      '192.52.193.255',
      '192.88.99.0',
      '192.88.99.1',
      '192.88.99.254',
      '192.88.99.255',
      '192.168.0.0',
      '192.168.0.1',
      '192.168.255.254',
      '192.168.255.255',
      '192.175.48.0',
      '192.175.48.1',
      '192.175.48.254',
      '192.175.48.255',
      '198.18.0.0',
      '198.18.0.1',
      '198.19.255.254',
      '198.19.255.255',
      '198.51.100.0',
      '198.51.100.1',
      '198.51.100.254',
      '198.51.100.255',
      '203.0.113.0',
      '203.0.113.1',
      '203.0.113.254',
      '203.0.113.255',
      '240.0.0.0',
      '240.0.0.1',
      '255.0.0.0',
      '255.192.0.0',
      '255.240.0.0',
      '255.254.0.0',
      '255.255.0.0',
      '255.255.255.0',
      '255.255.255.248',
      '255.255.255.254',
      '255.255.255.255',
      '::',
      '::1',
      '::ffff:0.0.0.0',
      '::ffff:0.0.255.255.255',
      '::ffff:0.255.255.255.255',
      '::ffff:255.255.255.255',
      '64:ff9b::0.0.0.0',
      '64:ff9b::255.255.255.255',
      '100::',
      '100::0:0:0:0',
      '100::1:eabc:0:2',
      '100::ffff::',
      '100::ffff:ffff:ffff:ffff',
      '2001::',
      '2001::a:b:c',
      '2001::ffff:ffff:ffff:ffff:ffff:ffff',
      '2001:20::',
      '2001:20::a:b:c',
      '2001:2f::a:b:c',
      '2001:2f:ffff:ffff:ffff:ffff:ffff:ffff',
      '2001:db8::',
      '2001:db8::1',
      '2001:db8:abc::1',
      '2001:db8:ffff:ffff:ffff:ffff:ffff:ffff',
      '2002::',
      '2002::1',
      '2002::abc:1',
      '2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
      'fe80::',
      'fe80::1',
      'fe80::abc:1',
      'febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
      'fc00::',
      'fc00::1',
      'fc00::abc:1',
      'fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
      'ff00::',
      'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
    ];
    const admitted = privIps.filter((address) => strict(address).ok);
    expect(admitted).toEqual([]);
  });

  it.each([
    // Encodings PayloadsAllTheThings lists under "Bypass Using an Encoded IP Address" and "Rare
    // Address": a socket would resolve these itself, so only canonical text is accepted.
    '2130706433',
    '0177.0.0.1',
    '0x7f.1',
    '127.1',
    '0',
    'localhost',
    '',
  ])('refuses non-canonical address text %j as unparseable', (text) => {
    expect(strict(text)).toMatchObject({ ok: false, classification: 'unparseable' });
  });
});

describe('address policy: embedded IPv4 is judged by what it carries', () => {
  it.each([
    // PayloadsAllTheThings, "Bypass Localhost with IPv6 Notation": [0:0:0:0:0:ffff:127.0.0.1], [::ffff:127.0.0.1].
    ['0:0:0:0:0:ffff:127.0.0.1', 'loopback', 'ipv4_mapped', '127.0.0.1'],
    ['::ffff:127.0.0.1', 'loopback', 'ipv4_mapped', '127.0.0.1'],
    ['::ffff:10.0.0.1', 'private', 'ipv4_mapped', '10.0.0.1'],
    // PayloadsAllTheThings, SSRF-Cloud-Instances.md: [::ffff:a9fe:a9fe] and [0:0:0:0:0:ffff:169.254.169.254].
    ['::ffff:a9fe:a9fe', 'cloud_metadata', 'ipv4_mapped', '169.254.169.254'],
    ['0:0:0:0:0:ffff:169.254.169.254', 'cloud_metadata', 'ipv4_mapped', '169.254.169.254'],
    // NAT64 well-known prefix (RFC 6052 §2.1) carrying loopback, private and metadata addresses.
    ['64:ff9b::127.0.0.1', 'loopback', 'nat64', '127.0.0.1'],
    ['64:ff9b::c0a8:101', 'private', 'nat64', '192.168.1.1'],
    ['64:ff9b::a9fe:a9fe', 'cloud_metadata', 'nat64', '169.254.169.254'],
    // 6to4 (RFC 3056 §2): 2002:WWXX:YYZZ::/48 carries WW.XX.YY.ZZ.
    ['2002:7f00:1::1', 'loopback', '6to4', '127.0.0.1'],
    ['2002:c0a8:101::1', 'private', '6to4', '192.168.1.1'],
    ['2002:a9fe:a9fe::', 'cloud_metadata', '6to4', '169.254.169.254'],
    // Teredo example of the Wikipedia "Teredo tunneling" article: client 192.0.2.45 behind server 65.54.227.120.
    ['2001:0:4136:e378:8000:63bf:3fff:fdd2', 'documentation', 'teredo', '192.0.2.45'],
    // The same server, client 10.0.0.1 (inverted: f5ff:fffe).
    ['2001:0:4136:e378:8000:63bf:f5ff:fffe', 'private', 'teredo', '10.0.0.1'],
  ])('refuses %s as %s via %s', (address, classification, via, embedded) => {
    expect(strict(address)).toMatchObject({ ok: false, address, classification, via, embedded });
  });
});

describe('address policy: operator exceptions', () => {
  it('admits addresses inside an exception CIDR, and says so', () => {
    const policy = createAddressPolicy(['127.0.0.1/32', '10.1.0.0/16']);
    expect(policy('127.0.0.1')).toEqual({ ok: true, address: '127.0.0.1', family: 4, excepted: true });
    expect(policy('10.1.200.3')).toMatchObject({ ok: true, excepted: true });
    expect(policy('127.0.0.2')).toMatchObject({ ok: false, classification: 'loopback' });
    expect(policy('10.2.0.1')).toMatchObject({ ok: false, classification: 'private' });
  });

  it('applies IPv4 exceptions to IPv4-mapped forms, connecting to the IPv4 address', () => {
    const policy = createAddressPolicy(['127.0.0.1/32']);
    expect(policy('::ffff:127.0.0.1')).toEqual({ ok: true, address: '127.0.0.1', family: 4, excepted: true });
  });

  it('never excepts a cloud metadata address, however it is written', () => {
    const everything = createAddressPolicy(['0.0.0.0/0', '::/0']);
    for (const address of CLOUD_METADATA_ADDRESSES) {
      expect(everything(address)).toMatchObject({ ok: false, classification: 'cloud_metadata' });
    }
    expect(everything('::ffff:169.254.169.254')).toMatchObject({ ok: false, classification: 'cloud_metadata' });
    expect(everything('64:ff9b::a9fe:a9fe')).toMatchObject({ ok: false, classification: 'cloud_metadata' });
    // ...while the rest of link-local does pass when excepted.
    expect(createAddressPolicy(['169.254.0.0/16'])('169.254.1.1')).toMatchObject({ ok: true, excepted: true });
  });

  it('refuses the cloud metadata addresses without any exception too', () => {
    for (const address of CLOUD_METADATA_ADDRESSES) {
      expect(strict(address)).toMatchObject({ ok: false, classification: 'cloud_metadata' });
    }
    // Azure WireServer is a public address: only the metadata list stands between it and a call.
    expect(strict('168.63.129.16')).toMatchObject({ ok: false, classification: 'cloud_metadata' });
  });

  it('fails at construction on an invalid exception CIDR', () => {
    expect(() => createAddressPolicy(['999.1.1.1/8'])).toThrow(/invalid egress exception CIDR/);
    expect(() => createAddressPolicy(['10.0.0.0/33'])).toThrow(/invalid egress exception CIDR/);
  });
});
