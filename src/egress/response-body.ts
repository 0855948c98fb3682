import { Writable, type Readable, type Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import zlib from 'node:zlib';

/**
 * The decoders for the encodings the gateway asks for (it sends its own `accept-encoding`).
 * Done here rather than with undici's decompress interceptor, which is experimental, passes
 * unknown encodings through still encoded, and skips error responses by default.
 */
const DECODERS: Record<string, () => Transform> = {
  gzip: () => zlib.createGunzip(),
  'x-gzip': () => zlib.createGunzip(),
  deflate: () => zlib.createInflate(),
  br: () => zlib.createBrotliDecompress(),
};
export const ACCEPT_ENCODING = 'gzip, deflate, br';
const MAX_ENCODINGS = 3;

/** Thrown while reading a body: the destination's fault, reported as `tool_backend_failed`. */
export class ResponseBodyError extends Error {
  override name = 'ResponseBodyError';
  constructor(
    readonly reason: 'response_too_large' | 'response_decoding_failed',
    readonly details: Record<string, unknown>,
  ) {
    super(reason);
  }
}

/** The decoders `content-encoding` calls for, outermost last; `identity` needs none. */
function decodersFor(contentEncoding: string | undefined): Transform[] {
  const codings = (contentEncoding ?? '')
    .split(',')
    .map((coding) => coding.trim().toLowerCase())
    .filter((coding) => coding !== '' && coding !== 'identity');
  const unusable = () => new ResponseBodyError('response_decoding_failed', { content_encoding: contentEncoding });
  if (codings.length > MAX_ENCODINGS) throw unusable();
  return codings.reverse().map((coding) => {
    const decoder = DECODERS[coding];
    if (!decoder) throw unusable();
    return decoder();
  });
}

/**
 * Reads a response body, decoded, refusing to hold more than `maxBytes` of it: counting happens
 * after decompression, so a small compressed bomb is stopped as soon as it grows past the cap.
 * Returns the bytes and whether any decoding was applied.
 */
export async function readBody(
  body: Readable,
  contentEncoding: string | undefined,
  maxBytes: number,
): Promise<{ bytes: Buffer; decoded: boolean }> {
  const decoders = decodersFor(contentEncoding);
  const chunks: Buffer[] = [];
  let total = 0;
  const sink = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      total += chunk.length;
      if (total > maxBytes) {
        callback(new ResponseBodyError('response_too_large', { max_response_bytes: maxBytes }));
        return;
      }
      chunks.push(chunk);
      callback();
    },
  });
  try {
    await pipeline([body, ...decoders, sink]);
  } catch (error) {
    if (error instanceof ResponseBodyError) throw error;
    // zlib reports corrupt data with a Z_* code; anything else (an abort, a reset) is not ours.
    const code = (error as NodeJS.ErrnoException).code;
    if (decoders.length > 0 && code?.startsWith('Z_')) {
      const details = { content_encoding: contentEncoding, zlib_code: code };
      throw new ResponseBodyError('response_decoding_failed', details);
    }
    throw error;
  }
  return { bytes: Buffer.concat(chunks), decoded: decoders.length > 0 };
}

/**
 * The output `body`: parsed JSON when the content type is JSON (`application/json`, `*+json`) and
 * the text parses, else the text, decoded with the declared charset (UTF-8 when absent or unknown).
 */
export function decodeBody(bytes: Buffer, contentType: string | undefined): unknown {
  const [mediaType = '', ...parameters] = (contentType ?? '').split(';').map((part) => part.trim().toLowerCase());
  const charset = parameters.find((parameter) => parameter.startsWith('charset='))?.slice('charset='.length);
  let text: string;
  try {
    text = new TextDecoder(charset?.replace(/^"|"$/g, '') || 'utf-8').decode(bytes);
  } catch {
    text = new TextDecoder('utf-8').decode(bytes);
  }
  if (mediaType === 'application/json' || mediaType.endsWith('+json')) {
    try {
      return JSON.parse(text) as unknown;
    } catch {
      return text;
    }
  }
  return text;
}
