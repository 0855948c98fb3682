import { Readable } from 'node:stream';
import zlib from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { ResponseBodyError, decodeBody, readBody } from '../../src/egress/response-body.js';

const stream = (bytes: Buffer) => Readable.from([bytes]);

describe('reading a response body', () => {
  it('decodes gzip, deflate and brotli, and stacked encodings in reverse order', async () => {
    const text = Buffer.from('hello egress');
    expect((await readBody(stream(zlib.gzipSync(text)), 'gzip', 100)).bytes.toString()).toBe('hello egress');
    expect((await readBody(stream(zlib.deflateSync(text)), 'deflate', 100)).bytes.toString()).toBe('hello egress');
    expect((await readBody(stream(zlib.brotliCompressSync(text)), 'br', 100)).bytes.toString()).toBe('hello egress');
    const stacked = zlib.brotliCompressSync(zlib.gzipSync(text));
    expect(await readBody(stream(stacked), 'gzip, br', 100)).toEqual({ bytes: text, decoded: true });
    expect(await readBody(stream(text), 'identity', 100)).toEqual({ bytes: text, decoded: false });
  });

  it('caps the body after decompression, so a small bomb is stopped', async () => {
    const bomb = zlib.gzipSync(Buffer.alloc(8 * 1024 * 1024));
    expect(bomb.length).toBeLessThan(64 * 1024);
    await expect(readBody(stream(bomb), 'gzip', 64 * 1024)).rejects.toMatchObject({
      name: 'ResponseBodyError',
      reason: 'response_too_large',
    });
  });

  it('caps an unencoded body too, and accepts one exactly at the cap', async () => {
    await expect(readBody(stream(Buffer.alloc(11)), undefined, 10)).rejects.toBeInstanceOf(ResponseBodyError);
    expect((await readBody(stream(Buffer.alloc(10)), undefined, 10)).bytes.length).toBe(10);
  });

  it('fails on encodings it did not ask for and on corrupt data', async () => {
    await expect(readBody(stream(Buffer.from('x')), 'zstd', 100)).rejects.toMatchObject({
      reason: 'response_decoding_failed',
    });
    await expect(readBody(stream(Buffer.from('not gzip at all')), 'gzip', 100)).rejects.toMatchObject({
      reason: 'response_decoding_failed',
    });
  });
});

describe('the output body', () => {
  it('is parsed JSON for JSON content types', () => {
    expect(decodeBody(Buffer.from('{"a":[1,2]}'), 'application/json; charset=utf-8')).toEqual({ a: [1, 2] });
    expect(decodeBody(Buffer.from('{"a":1}'), 'application/problem+json')).toEqual({ a: 1 });
  });

  it('is the text when the content type is not JSON, or the JSON does not parse', () => {
    expect(decodeBody(Buffer.from('{"a":1}'), 'text/plain')).toBe('{"a":1}');
    expect(decodeBody(Buffer.from('{broken'), 'application/json')).toBe('{broken');
    expect(decodeBody(Buffer.from('plain'), undefined)).toBe('plain');
  });

  it('honours the declared charset, falling back to UTF-8 for unknown ones', () => {
    expect(decodeBody(Buffer.from([0x63, 0x61, 0x66, 0xe9]), 'text/plain; charset=iso-8859-1')).toBe('café');
    expect(decodeBody(Buffer.from('café'), 'text/plain; charset=no-such-charset')).toBe('café');
  });
});
