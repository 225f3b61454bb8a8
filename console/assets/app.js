// node_modules/@noble/hashes/_u64.js
var fromNumH = (n) => n / 2 ** 32 | 0;
var fromNumL = (n) => n >>> 0;

// node_modules/@noble/hashes/utils.js
function isBytes(a) {
  return a instanceof Uint8Array || ArrayBuffer.isView(a) && a.constructor.name === "Uint8Array" && "BYTES_PER_ELEMENT" in a && a.BYTES_PER_ELEMENT === 1;
}
var atitle = (title) => title ? `"${title}" ` : "";
function anumber(n, title = "") {
  if (typeof n !== "number")
    throw new TypeError(atitle(title) + "expected number, got " + typeof n);
  if (!Number.isSafeInteger(n) || n < 0)
    throw new RangeError(atitle(title) + "expected integer >= 0, got " + n);
  return n;
}
function abytes(value, length, title = "") {
  if (isBytes(value) && (length === void 0 || value.length === length))
    return value;
  if (length !== void 0)
    anumber(length, "length");
  const bytes = isBytes(value);
  const ofLen = length !== void 0 ? ` of length ${length}` : "";
  const got = bytes ? `length=${value.length}` : `type=${typeof value}`;
  const message = atitle(title) + "expected Uint8Array" + ofLen + ", got " + got;
  if (!bytes)
    throw new TypeError(message);
  throw new RangeError(message);
}
function copyBytes(bytes) {
  return Uint8Array.from(abytes(bytes));
}
var aobject = (value, label) => {
  if (value === null || typeof value !== "object" || Array.isArray(value))
    throw new TypeError((label === "object" ? "" : `"${label}" `) + "expected object, got type=" + typeof value);
};
var aopts = (value, label) => {
  aobject(value, label);
  const proto = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null)
    throw new TypeError(`"${label}" expected plain object`);
  if (Object.hasOwn(value, "__proto__"))
    throw new TypeError(`"${label}.__proto__" is not allowed`);
};
function aexists(instance, checkFinished = true) {
  if (instance.destroyed)
    throw new Error("hash was destroyed");
  if (checkFinished && instance.finished)
    throw new Error("digest() was already called");
}
function aoutput(out, instance) {
  abytes(out, void 0, "output");
  const min = instance.outputLen;
  if (!(out.length >= min)) {
    throw new RangeError('"output" expected length >= ' + min);
  }
}
function u8(arr) {
  return new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength);
}
function u32(arr) {
  return new Uint32Array(arr.buffer, arr.byteOffset, Math.floor(arr.byteLength / 4));
}
function clean(...arrays) {
  for (let i = 0; i < arrays.length; i++) {
    arrays[i].fill(0);
  }
}
function rotr(word, shift) {
  return word << 32 - shift | word >>> shift;
}
var isLE = /* @__PURE__ */ (() => new Uint8Array(new Uint32Array([287454020]).buffer)[0] === 68)();
function byteSwap(word) {
  return word << 24 & 4278190080 | word << 8 & 16711680 | word >>> 8 & 65280 | word >>> 24 & 255;
}
var swap8IfBE = isLE ? (n) => n : (n) => byteSwap(n) >>> 0;
function byteSwap32(arr) {
  for (let i = 0; i < arr.length; i++) {
    arr[i] = byteSwap(arr[i]);
  }
  return arr;
}
var swap32IfBE = isLE ? (u) => u : byteSwap32;
function checkOpts(defaults, opts, title = "opts") {
  aopts(defaults, "defaults");
  if (opts !== void 0)
    aopts(opts, title);
  const merged = Object.assign(/* @__PURE__ */ Object.create(null), defaults, opts);
  return merged;
}
function createHasher(hashCons, info = {}) {
  if (typeof hashCons !== "function")
    throw new TypeError('"hashCons" expected function, got type=' + typeof hashCons);
  info = checkOpts({}, info, "info");
  const hashC = (msg, opts) => hashCons(opts).update(msg).digest();
  const tmp = hashCons(void 0);
  hashC.outputLen = tmp.outputLen;
  hashC.blockLen = tmp.blockLen;
  hashC.canXOF = tmp.canXOF;
  hashC.create = (opts) => hashCons(opts);
  Object.assign(hashC, info);
  return Object.freeze(hashC);
}

// node_modules/@noble/hashes/_md.js
var SHA256_IV = /* @__PURE__ */ Uint32Array.from([
  1779033703,
  3144134277,
  1013904242,
  2773480762,
  1359893119,
  2600822924,
  528734635,
  1541459225
]);

// node_modules/@noble/hashes/_blake.js
function G1s(a, b, c, d, x) {
  a = a + b + x | 0;
  d = rotr(d ^ a, 16);
  c = c + d | 0;
  b = rotr(b ^ c, 12);
  return { a, b, c, d };
}
function G2s(a, b, c, d, x) {
  a = a + b + x | 0;
  d = rotr(d ^ a, 8);
  c = c + d | 0;
  b = rotr(b ^ c, 7);
  return { a, b, c, d };
}

// node_modules/@noble/hashes/blake2.js
var _BLAKE2 = class {
  buffer;
  buffer32;
  finished = false;
  destroyed = false;
  length = 0;
  pos = 0;
  blockLen;
  outputLen;
  canXOF = false;
  constructor(blockLen, outputLen) {
    anumber(blockLen);
    anumber(outputLen);
    this.blockLen = blockLen;
    this.outputLen = outputLen;
    this.buffer = new Uint8Array(blockLen);
    this.buffer32 = u32(this.buffer);
  }
  update(data) {
    aexists(this);
    abytes(data);
    const { blockLen, buffer, buffer32 } = this;
    const len = data.length;
    const offset = data.byteOffset;
    const buf = data.buffer;
    for (let pos = 0; pos < len; ) {
      if (this.pos === blockLen) {
        swap32IfBE(buffer32);
        this.compress(buffer32, 0, false);
        swap32IfBE(buffer32);
        this.pos = 0;
      }
      const take = Math.min(blockLen - this.pos, len - pos);
      const dataOffset = offset + pos;
      if (take === blockLen && !(dataOffset % 4) && pos + take < len) {
        const data32 = new Uint32Array(buf, dataOffset, Math.floor((len - pos) / 4));
        swap32IfBE(data32);
        for (let pos32 = 0; pos + blockLen < len; pos32 += buffer32.length, pos += blockLen) {
          this.length += blockLen;
          this.compress(data32, pos32, false);
        }
        swap32IfBE(data32);
        continue;
      }
      buffer.set(pos === 0 && take === len ? data : data.subarray(pos, pos + take), this.pos);
      this.pos += take;
      this.length += take;
      pos += take;
    }
    return this;
  }
  digestInto(out) {
    aexists(this);
    aoutput(out, this);
    if (out.byteOffset & 3)
      throw new RangeError('"output" expected 4-byte aligned byteOffset, got ' + out.byteOffset);
    const { pos, buffer32 } = this;
    this.finished = true;
    this.buffer.fill(0, pos);
    swap32IfBE(buffer32);
    this.compress(buffer32, 0, true);
    swap32IfBE(buffer32);
    const state = this.get();
    const out32 = out === this.buffer ? buffer32 : u32(out);
    const full = Math.floor(this.outputLen / 4);
    for (let i = 0; i < full; i++)
      out32[i] = swap8IfBE(state[i]);
    const tail = this.outputLen % 4;
    if (!tail)
      return;
    const off = full * 4;
    const word = state[full];
    for (let i = 0; i < tail; i++)
      out[off + i] = word >>> 8 * i;
  }
  digest() {
    const { buffer, outputLen } = this;
    this.digestInto(buffer);
    const res = buffer.slice(0, outputLen);
    this.destroy();
    return res;
  }
  _cloneInto(to) {
    const { buffer, length, finished, destroyed, outputLen, pos } = this;
    to ||= new this.constructor({ dkLen: outputLen });
    to.set(...this.get());
    to.buffer.set(buffer);
    to.destroyed = destroyed;
    to.finished = finished;
    to.length = length;
    to.pos = pos;
    to.outputLen = outputLen;
    return to;
  }
  clone() {
    return this._cloneInto();
  }
};
function _compress(s, offset, msg, rounds, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15) {
  let j = 0;
  for (let i = 0; i < rounds; i++) {
    ({ a: v0, b: v4, c: v8, d: v12 } = G1s(v0, v4, v8, v12, msg[offset + s[j++]]));
    ({ a: v0, b: v4, c: v8, d: v12 } = G2s(v0, v4, v8, v12, msg[offset + s[j++]]));
    ({ a: v1, b: v5, c: v9, d: v13 } = G1s(v1, v5, v9, v13, msg[offset + s[j++]]));
    ({ a: v1, b: v5, c: v9, d: v13 } = G2s(v1, v5, v9, v13, msg[offset + s[j++]]));
    ({ a: v2, b: v6, c: v10, d: v14 } = G1s(v2, v6, v10, v14, msg[offset + s[j++]]));
    ({ a: v2, b: v6, c: v10, d: v14 } = G2s(v2, v6, v10, v14, msg[offset + s[j++]]));
    ({ a: v3, b: v7, c: v11, d: v15 } = G1s(v3, v7, v11, v15, msg[offset + s[j++]]));
    ({ a: v3, b: v7, c: v11, d: v15 } = G2s(v3, v7, v11, v15, msg[offset + s[j++]]));
    ({ a: v0, b: v5, c: v10, d: v15 } = G1s(v0, v5, v10, v15, msg[offset + s[j++]]));
    ({ a: v0, b: v5, c: v10, d: v15 } = G2s(v0, v5, v10, v15, msg[offset + s[j++]]));
    ({ a: v1, b: v6, c: v11, d: v12 } = G1s(v1, v6, v11, v12, msg[offset + s[j++]]));
    ({ a: v1, b: v6, c: v11, d: v12 } = G2s(v1, v6, v11, v12, msg[offset + s[j++]]));
    ({ a: v2, b: v7, c: v8, d: v13 } = G1s(v2, v7, v8, v13, msg[offset + s[j++]]));
    ({ a: v2, b: v7, c: v8, d: v13 } = G2s(v2, v7, v8, v13, msg[offset + s[j++]]));
    ({ a: v3, b: v4, c: v9, d: v14 } = G1s(v3, v4, v9, v14, msg[offset + s[j++]]));
    ({ a: v3, b: v4, c: v9, d: v14 } = G2s(v3, v4, v9, v14, msg[offset + s[j++]]));
  }
  return { v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 };
}

// node_modules/@noble/hashes/blake3.js
var B3_Flags = {
  CHUNK_START: 1,
  CHUNK_END: 2,
  PARENT: 4,
  ROOT: 8,
  KEYED_HASH: 16,
  DERIVE_KEY_CONTEXT: 32,
  DERIVE_KEY_MATERIAL: 64
};
var B3_IV = /* @__PURE__ */ SHA256_IV.slice();
var B3_SIGMA = /* @__PURE__ */ (() => {
  const Id = Array.from({ length: 16 }, (_, i) => i);
  const permute = (arr) => [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8].map((i) => arr[i]);
  const res = [];
  for (let i = 0, v = Id; i < 7; i++, v = permute(v))
    res.push(...v);
  return Uint8Array.from(res);
})();
var _BLAKE3 = class __BLAKE3 extends _BLAKE2 {
  canXOF = true;
  chunkPos = 0;
  // Position of current block in chunk
  // How many chunks we already have; exact while this stays within
  // JS's safe-integer range.
  chunksDone = 0;
  flags = 0 | 0;
  IV;
  state;
  stack = [];
  // Output
  posOut = 0;
  bufferOut32 = new Uint32Array(16);
  bufferOut;
  // Index of output chunk; exact while this stays within JS's
  // safe-integer range.
  chunkOut = 0;
  enableXOF = true;
  constructor(opts = {}, flags = 0) {
    opts = checkOpts({}, opts);
    super(64, opts.dkLen === void 0 ? 32 : opts.dkLen);
    const { key, context } = opts;
    const hasContext = context !== void 0;
    if (key !== void 0) {
      if (hasContext)
        throw new Error('cannot use both "key" and "context"');
      abytes(key, 32, "key");
      const k = copyBytes(key);
      this.IV = u32(k);
      swap32IfBE(this.IV);
      this.flags = flags | B3_Flags.KEYED_HASH;
    } else if (hasContext) {
      abytes(context, void 0, "context");
      const ctx = context;
      const contextKey = new __BLAKE3({ dkLen: 32 }, B3_Flags.DERIVE_KEY_CONTEXT).update(ctx).digest();
      this.IV = u32(contextKey);
      swap32IfBE(this.IV);
      this.flags = flags | B3_Flags.DERIVE_KEY_MATERIAL;
    } else {
      this.IV = B3_IV;
      this.flags = flags;
    }
    this.state = this.IV.slice();
    this.bufferOut = u8(this.bufferOut32);
  }
  // _BLAKE2's scalar-state hooks are unused here: BLAKE3 keeps its tree/XOF state in arrays and
  // copies it directly in _cloneInto().
  get() {
    return [];
  }
  set() {
  }
  // Truncated chunk/parent compression: seed v8..v15 as IV[0..3], t0, t1,
  // block length, and flags, then keep only the first 8 output words.
  b2Compress(counter, flags, buf, bufPos = 0) {
    const { state: s, pos } = this;
    const t0 = fromNumL(counter);
    const t1 = fromNumH(counter);
    const { v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 } = _compress(B3_SIGMA, bufPos, buf, 7, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], B3_IV[0], B3_IV[1], B3_IV[2], B3_IV[3], t0, t1, pos, flags);
    s[0] = v0 ^ v8;
    s[1] = v1 ^ v9;
    s[2] = v2 ^ v10;
    s[3] = v3 ^ v11;
    s[4] = v4 ^ v12;
    s[5] = v5 ^ v13;
    s[6] = v6 ^ v14;
    s[7] = v7 ^ v15;
  }
  compress(buf, bufPos = 0, isLast = false) {
    let flags = this.flags;
    if (!this.chunkPos)
      flags |= B3_Flags.CHUNK_START;
    if (this.chunkPos === 15 || isLast)
      flags |= B3_Flags.CHUNK_END;
    if (!isLast)
      this.pos = this.blockLen;
    this.b2Compress(this.chunksDone, flags, buf, bufPos);
    this.chunkPos += 1;
    if (this.chunkPos === 16 || isLast) {
      let chunk = this.state;
      this.state = this.IV.slice();
      for (let last, chunks = this.chunksDone + 1; isLast || !(chunks & 1); chunks = Math.floor(chunks / 2)) {
        if (!(last = this.stack.pop()))
          break;
        this.buffer32.set(last, 0);
        this.buffer32.set(chunk, 8);
        this.pos = this.blockLen;
        this.b2Compress(0, this.flags | B3_Flags.PARENT, this.buffer32, 0);
        chunk = this.state;
        this.state = this.IV.slice();
      }
      this.chunksDone++;
      this.chunkPos = 0;
      this.stack.push(chunk);
    }
    this.pos = 0;
  }
  // Overriding hides _BLAKE2's flat implementation, which would otherwise be inherited
  // and silently miss the tree state (CV stack, chunk counters; get()/set() are stubs here).
  _cloneInto(to) {
    const staleOutput = !!to && to.finished && !to.destroyed;
    to = super._cloneInto(to);
    const { IV, flags, state, chunkPos, posOut, chunkOut, stack, chunksDone } = this;
    to.state.set(state);
    to.stack = stack.map((i) => Uint32Array.from(i));
    if (IV === B3_IV) {
      if (to.IV !== B3_IV)
        clean(to.IV);
      to.IV = B3_IV;
    } else if (to.IV === B3_IV) {
      to.IV = IV.slice();
    } else {
      to.IV.set(IV);
    }
    to.flags = flags;
    to.chunkPos = chunkPos;
    to.chunksDone = chunksDone;
    to.posOut = posOut;
    to.chunkOut = chunkOut;
    to.enableXOF = this.enableXOF;
    if (this.finished) {
      to.bufferOut32.set(this.bufferOut32);
    } else if (staleOutput) {
      clean(to.bufferOut32);
    }
    return to;
  }
  destroy() {
    this.destroyed = true;
    clean(this.state, this.buffer32, this.bufferOut32);
    if (this.IV !== B3_IV)
      clean(this.IV);
    clean(...this.stack);
  }
  // Root/XOF compression: rerun the same ROOT inputs with incrementing output
  // counter `t` and materialize all 16 output words.
  // Same as b2Compress, but doesn't modify state and returns 16 u32 array (instead of 8)
  b2CompressOut() {
    const { state: s, pos, flags, buffer32, bufferOut32: out32 } = this;
    const outCounter = this.chunkOut++;
    const t0 = fromNumL(outCounter);
    const t1 = fromNumH(outCounter);
    swap32IfBE(buffer32);
    const { v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 } = _compress(B3_SIGMA, 0, buffer32, 7, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], B3_IV[0], B3_IV[1], B3_IV[2], B3_IV[3], t0, t1, pos, flags);
    out32[0] = v0 ^ v8;
    out32[1] = v1 ^ v9;
    out32[2] = v2 ^ v10;
    out32[3] = v3 ^ v11;
    out32[4] = v4 ^ v12;
    out32[5] = v5 ^ v13;
    out32[6] = v6 ^ v14;
    out32[7] = v7 ^ v15;
    out32[8] = s[0] ^ v8;
    out32[9] = s[1] ^ v9;
    out32[10] = s[2] ^ v10;
    out32[11] = s[3] ^ v11;
    out32[12] = s[4] ^ v12;
    out32[13] = s[5] ^ v13;
    out32[14] = s[6] ^ v14;
    out32[15] = s[7] ^ v15;
    swap32IfBE(buffer32);
    swap32IfBE(out32);
    this.posOut = 0;
  }
  finish() {
    if (this.finished)
      return;
    this.finished = true;
    this.buffer.fill(0, this.pos);
    let flags = this.flags | B3_Flags.ROOT;
    if (this.stack.length) {
      flags |= B3_Flags.PARENT;
      swap32IfBE(this.buffer32);
      this.compress(this.buffer32, 0, true);
      swap32IfBE(this.buffer32);
      this.chunksDone = 0;
      this.pos = this.blockLen;
    } else {
      flags |= (!this.chunkPos ? B3_Flags.CHUNK_START : 0) | B3_Flags.CHUNK_END;
    }
    this.flags = flags;
    this.b2CompressOut();
  }
  writeInto(out) {
    aexists(this, false);
    abytes(out);
    this.finish();
    const { blockLen, bufferOut } = this;
    for (let pos = 0, len = out.length; pos < len; ) {
      if (this.posOut >= blockLen)
        this.b2CompressOut();
      const take = Math.min(blockLen - this.posOut, len - pos);
      out.set(bufferOut.subarray(this.posOut, this.posOut + take), pos);
      this.posOut += take;
      pos += take;
    }
    return out;
  }
  xofInto(out) {
    if (!this.enableXOF)
      throw new Error("no XOF after digest()");
    return this.writeInto(out);
  }
  xof(bytes) {
    anumber(bytes);
    return this.xofInto(new Uint8Array(bytes));
  }
  digestInto(out) {
    aoutput(out, this);
    if (this.finished)
      throw new Error("digest() was already called");
    this.enableXOF = false;
    this.writeInto(out.length === this.outputLen ? out : out.subarray(0, this.outputLen));
    this.destroy();
  }
  digest() {
    const out = new Uint8Array(this.outputLen);
    this.digestInto(out);
    return out;
  }
};
var blake3 = /* @__PURE__ */ createHasher((opts = {}) => new _BLAKE3(opts));

// src/verify.js
var RECEIPT_FORMAT = "capkernel-receipt/v2";
var BUNDLE_FORMAT = "capkernel-receipt-bundle/v1";
var enc = new TextEncoder();
function canonicalize(v) {
  if (v === null || typeof v === "boolean") return JSON.stringify(v);
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new Error("JCS: a number that is not finite");
    return JSON.stringify(v);
  }
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(canonicalize).join(",") + "]";
  if (typeof v === "object") {
    const keys2 = Object.keys(v).sort();
    return "{" + keys2.map((k) => JSON.stringify(k) + ":" + canonicalize(v[k])).join(",") + "}";
  }
  throw new Error("JCS: cannot serialize a " + typeof v);
}
var MAX_DEPTH = 1e4;
var NUMBER = /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
var utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
function parseStrict(input, { maxDepth = MAX_DEPTH, plainIntegers = false } = {}) {
  let text = input;
  if (typeof input !== "string") {
    try {
      text = utf8.decode(input);
    } catch {
      throw new Error("JSON: not UTF-8");
    }
  }
  if (!text.isWellFormed()) throw new Error("JSON: a lone surrogate (not UTF-8)");
  let i = 0;
  const fail = (what) => {
    throw new Error("JSON: " + what + " at offset " + i);
  };
  const ws = () => {
    while (i < text.length && (text[i] === " " || text[i] === "	" || text[i] === "\n" || text[i] === "\r")) i++;
  };
  const str = () => {
    i++;
    let out = "";
    for (; ; ) {
      const j = i;
      while (i < text.length && text[i] !== '"' && text[i] !== "\\" && text.charCodeAt(i) >= 32) i++;
      out += text.slice(j, i);
      if (i >= text.length) fail("unterminated string");
      const c = text[i];
      if (c === '"') {
        i++;
        return out;
      }
      if (c !== "\\") fail("control character in a string");
      const e = text[i + 1];
      const short = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "	" }[e];
      if (short !== void 0) {
        out += short;
        i += 2;
        continue;
      }
      if (e !== "u") fail("bad escape");
      const unit = (at) => /^[0-9a-fA-F]{4}$/.test(text.slice(at, at + 4)) ? parseInt(text.slice(at, at + 4), 16) : fail("bad \\u escape");
      const u = unit(i + 2);
      i += 6;
      if (u >= 56320 && u <= 57343) fail("\\u escape of a lone surrogate");
      if (u >= 55296 && u <= 56319) {
        const lo = text.slice(i, i + 2) === "\\u" ? unit(i + 2) : -1;
        if (lo < 56320 || lo > 57343) fail("\\u escape of a lone surrogate");
        out += String.fromCharCode(u, lo);
        i += 6;
        continue;
      }
      out += String.fromCharCode(u);
    }
  };
  const scalar = () => {
    const c = text[i];
    if (c === '"') return str();
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (m) {
      if (plainIntegers && (m[2] || m[3] || c === "-")) fail("number " + m[0] + " is not a non-negative integer in plain digits");
      i += m[0].length;
      return Number(m[0]);
    }
    for (const [lit, v2] of [["true", true], ["false", false], ["null", null]]) {
      if (text.startsWith(lit, i)) {
        i += lit.length;
        return v2;
      }
    }
    return fail("invalid character " + JSON.stringify(c ?? "end of input"));
  };
  const value = () => {
    const stack = [];
    let done;
    const put = (v2) => {
      const top = stack.at(-1);
      if (!top) done = { v: v2 };
      else if (Array.isArray(top.out)) top.out.push(v2);
      else Object.defineProperty(top.out, top.name, { value: v2, writable: true, enumerable: true, configurable: true });
    };
    const member = (top) => {
      ws();
      if (text[i] !== '"') fail("expected a member name");
      const name = str();
      if (top.names.has(name)) fail("duplicate member name " + JSON.stringify(name));
      top.names.add(name);
      top.name = name;
      ws();
      if (text[i] !== ":") fail("expected :");
      i++;
    };
    for (; ; ) {
      ws();
      const c = text[i];
      if (c === "{" || c === "[") {
        if (stack.length >= maxDepth) fail("nesting deeper than " + maxDepth);
        i++;
        ws();
        const top = { out: c === "{" ? {} : [], names: /* @__PURE__ */ new Set(), close: c === "{" ? "}" : "]" };
        if (text[i] !== top.close) {
          stack.push(top);
          if (c === "{") member(top);
          continue;
        }
        i++;
        put(top.out);
      } else {
        put(scalar());
      }
      for (; ; ) {
        if (done) return done.v;
        const top = stack.at(-1);
        ws();
        if (text[i] === ",") {
          i++;
          if (!Array.isArray(top.out)) member(top);
          break;
        }
        if (text[i] !== top.close) fail("expected , or " + top.close);
        i++;
        stack.pop();
        put(top.out);
      }
    }
  };
  const v = value();
  ws();
  if (i !== text.length) fail("data after the JSON value");
  return v;
}
function hex(b) {
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}
function unhex(s) {
  if (!/^([0-9a-f]{2})*$/.test(s)) throw new Error("not lowercase hex: " + s.slice(0, 20));
  const out = new Uint8Array(s.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(s.slice(2 * i, 2 * i + 2), 16);
  return out;
}
function b64decode(s) {
  const bin = atob(s);
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}
function b64encode(b) {
  return btoa(String.fromCharCode(...b));
}
function b64urlDecode(s) {
  if (!/^[A-Za-z0-9_-]*$/.test(s)) throw new Error("not base64url without padding");
  const t = s.replace(/-/g, "+").replace(/_/g, "/");
  const b = b64decode(t + "===".slice((t.length + 3) % 4));
  if (b64urlEncode(b) !== s) throw new Error("not canonical base64url");
  return b;
}
function b64urlEncode(b) {
  return b64encode(b).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}
function equalBytes(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}
var LEAF_KEY = blake3(new Uint8Array(0), { context: enc.encode("capkernel ledger v1 leaf") });
var NODE_KEY = blake3(new Uint8Array(0), { context: enc.encode("capkernel ledger v1 node") });
var keys = { leaf: hex(LEAF_KEY), node: hex(NODE_KEY) };
function nodeHash(left, right) {
  return blake3(concat(left, right), { key: NODE_KEY });
}
function emptyRoot() {
  return blake3(new Uint8Array(0), { key: NODE_KEY });
}
function parseHash(s, what) {
  if (typeof s !== "string" || !/^blake3:[0-9a-f]{64}$/.test(s)) throw new Error(what + " is not blake3:<64 hex>");
  return unhex(s.slice(7));
}
var BODY_DEPTH = 1e3;
function validTime(t) {
  const [y, mo, d, h, mi, s] = [t.slice(0, 4), t.slice(5, 7), t.slice(8, 10), t.slice(11, 13), t.slice(14, 16), t.slice(17, 19)].map(Number);
  const leap = y % 4 === 0 && (y % 100 !== 0 || y % 400 === 0);
  const days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][mo - 1];
  return mo >= 1 && mo <= 12 && d >= 1 && d <= days && h <= 23 && mi <= 59 && s <= 59;
}
function parseEntry(record) {
  if (typeof record !== "string") throw new Error("the record is not a string");
  const e = parseStrict(record, { maxDepth: BODY_DEPTH + 1 });
  if (canonicalize(e) !== record) throw new Error("the record is not canonical JSON");
  const fields = ["body", "entry_hash", "kind", "prev_hash", "seq", "time"];
  const got = Object.keys(e).sort();
  if (got.join() !== fields.join()) throw new Error("record fields are " + got.join(",") + ", want " + fields.join(","));
  if (!Number.isSafeInteger(e.seq) || e.seq < 0) throw new Error("seq is not a non-negative integer below 2^53");
  if (typeof e.kind !== "string" || !/^[a-z][a-z0-9_]*$/.test(e.kind) || e.kind.length > 64) throw new Error("kind is malformed");
  if (typeof e.time !== "string" || !/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$/.test(e.time) || !validTime(e.time)) throw new Error("time is not a valid RFC 3339 UTC time with nine fractional digits");
  parseHash(e.prev_hash, "prev_hash");
  if (e.body === null || typeof e.body !== "object" || Array.isArray(e.body)) throw new Error("body is not an object");
  const pre = canonicalize({ body: e.body, kind: e.kind, prev_hash: e.prev_hash, seq: e.seq, time: e.time });
  const h = "blake3:" + hex(blake3(enc.encode(pre), { key: LEAF_KEY }));
  if (h !== e.entry_hash) throw new Error("entry_hash " + e.entry_hash + " does not recompute (" + h + ")");
  return e;
}
function rootFromInclusion(index, size, leaf, proof) {
  if (!(index < size)) throw new Error("leaf index " + index + " is not below tree size " + size);
  let fn = index, sn = size - 1, r = leaf;
  for (const p of proof) {
    if (sn === 0) throw new Error("the proof is longer than the path");
    if (fn % 2 === 1 || fn === sn) {
      r = nodeHash(p, r);
      if (fn % 2 === 0) {
        while (fn % 2 === 0 && fn !== 0) {
          fn = Math.floor(fn / 2);
          sn = Math.floor(sn / 2);
        }
      }
    } else {
      r = nodeHash(r, p);
    }
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  if (sn !== 0) throw new Error("the proof is shorter than the path");
  return r;
}
function verifyConsistency(size1, size2, root1, root2, proof) {
  if (size1 > size2) throw new Error("size1 is above size2");
  if (size1 === size2) {
    if (proof.length !== 0 || !equalBytes(root1, root2)) throw new Error("equal sizes need an empty proof and equal roots");
    return;
  }
  if (size1 === 0) {
    if (proof.length !== 0 || !equalBytes(root1, emptyRoot())) throw new Error("from size 0 the proof is empty and the old root the empty root");
    return;
  }
  let p = proof;
  if ((size1 & size1 - 1) === 0) p = [root1, ...proof];
  if (p.length === 0) throw new Error("empty consistency proof");
  let fn = size1 - 1, sn = size2 - 1;
  while (fn % 2 === 1) {
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  let fr = p[0], sr = p[0];
  for (const c of p.slice(1)) {
    if (sn === 0) throw new Error("the consistency proof is too long");
    if (fn % 2 === 1 || fn === sn) {
      fr = nodeHash(c, fr);
      sr = nodeHash(c, sr);
      if (fn % 2 === 0) {
        while (fn % 2 === 0 && fn !== 0) {
          fn = Math.floor(fn / 2);
          sn = Math.floor(sn / 2);
        }
      }
    } else {
      sr = nodeHash(sr, c);
    }
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  if (sn !== 0) throw new Error("the consistency proof is too short");
  if (!equalBytes(fr, root1)) throw new Error("the proof does not lead to the old root");
  if (!equalBytes(sr, root2)) throw new Error("the proof does not lead to the new root");
}
var NOTE_SPACE = /[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]/;
function checkLine(what, l) {
  if (l === "") throw new Error(what + " is empty");
  if (/[\x00-\x1f\x7f]/.test(l)) throw new Error(what + " " + JSON.stringify(l.slice(0, 40)) + " holds a control character");
}
function parseCheckpoint(note) {
  if (typeof note !== "string") throw new Error("the checkpoint is not a string");
  if (/[\x00-\x09\x0b-\x1f]/.test(note)) throw new Error("the note holds a control character");
  const sep = note.lastIndexOf("\n\n");
  if (sep < 0) throw new Error("the note has no signature block");
  const text = note.slice(0, sep + 1);
  const block = note.slice(sep + 2);
  if (!block.endsWith("\n")) throw new Error("the signature block does not end with a newline");
  const lines = text.slice(0, -1).split("\n");
  if (lines.length < 3) throw new Error("the checkpoint has fewer than three lines");
  const [origin, sizeLine, rootLine] = lines;
  checkLine("the origin", origin);
  if (!/^(0|[1-9][0-9]*)$/.test(sizeLine)) throw new Error("bad size line " + JSON.stringify(sizeLine));
  const size = Number(sizeLine);
  if (!Number.isSafeInteger(size)) throw new Error("size is too large");
  const root = b64decode(rootLine);
  if (root.length !== 32 || b64encode(root) !== rootLine) throw new Error("bad root line");
  lines.slice(3).forEach((l, i) => checkLine("extension line " + (i + 1), l));
  const sigLines = block.slice(0, -1).split("\n");
  if (sigLines.length > 100) throw new Error("the note has more than 100 signatures");
  const sigs = [];
  for (const l of sigLines) {
    if (!l.startsWith("— ")) throw new Error("bad signature line " + JSON.stringify(l.slice(0, 40)));
    const rest = l.slice(2);
    const sp = rest.indexOf(" ");
    const name = sp < 0 ? rest : rest.slice(0, sp);
    const b64 = sp < 0 ? "" : rest.slice(sp + 1);
    if (name === "" || NOTE_SPACE.test(name) || name.includes("+")) throw new Error("bad signer name " + JSON.stringify(name.slice(0, 40)));
    if (!/^[A-Za-z0-9+/]+={0,2}$/.test(b64) || b64.length % 4 !== 0) throw new Error("the signature by " + name + " is not base64");
    const raw = b64decode(b64);
    if (b64encode(raw) !== b64) throw new Error("the signature by " + name + " is not canonical base64");
    if (raw.length < 5) throw new Error("short signature");
    sigs.push({ name, keyID: raw.slice(0, 4), sig: raw.slice(4) });
  }
  return { text, origin, size, root, sigs };
}
async function noteKeyID(name, pub) {
  const h = new Uint8Array(await crypto.subtle.digest("SHA-256", concat(enc.encode(name + "\n"), new Uint8Array([1]), pub)));
  return h.slice(0, 4);
}
async function verifyCheckpoint(note, pub) {
  const cp = parseCheckpoint(note);
  const id = await noteKeyID(cp.origin, pub);
  const key = await importEd25519(pub);
  for (const s of cp.sigs) {
    if (s.name !== cp.origin || !equalBytes(s.keyID, id)) continue;
    if (s.sig.length === 64 && await crypto.subtle.verify("Ed25519", key, s.sig, enc.encode(cp.text))) return cp;
    throw new Error("the signature of " + s.name + " does not verify");
  }
  throw new Error("no signature by the kernel's key under the origin " + cp.origin);
}
var RECEIPT_REQUIRED = [
  "receipt_id",
  "operation_id",
  "tool_id",
  "agent_id",
  "capability_token_id",
  "args_hash",
  "result_hash",
  "tx_outcome",
  "policy_hash",
  "autonomy_mode",
  "risk_score",
  "ledger_seq",
  "ledger_entry_hash",
  "issued_at"
];
var RECEIPT_OPTIONAL = ["commit_delta_id", "error_class", "approval_id", "approved_by", "approval_reason"];
function importEd25519(pub) {
  return crypto.subtle.importKey("raw", pub, { name: "Ed25519" }, false, ["verify"]);
}
async function thumbprint(pub) {
  const j = canonicalize({ crv: "Ed25519", kty: "OKP", x: b64urlEncode(pub) });
  return b64urlEncode(new Uint8Array(await crypto.subtle.digest("SHA-256", enc.encode(j))));
}
async function verifyReceipt(jws, jwks2) {
  if (typeof jws !== "string") throw new Error("the receipt is not a string");
  const parts = jws.split(".");
  if (parts.length !== 3) throw new Error("not a compact JWS (three parts)");
  const header = new TextDecoder("utf-8", { fatal: true }).decode(b64urlDecode(parts[0]));
  const h = JSON.parse(header);
  if (typeof h.kid !== "string") throw new Error("the header has no kid");
  const want = canonicalize({ alg: "EdDSA", kid: h.kid, typ: "capkernel-receipt+jws" });
  if (header !== want) throw new Error("the header is not exactly " + want);
  const key = (await jwksKeys(jwks2)).find((k) => k.kid === h.kid);
  if (!key) throw new Error("no key " + h.kid + " in the JWKS as an Ed25519 signature key");
  const pub = key.pub;
  const sig = b64urlDecode(parts[2]);
  const ok = sig.length === 64 && await crypto.subtle.verify("Ed25519", await importEd25519(pub), sig, enc.encode(parts[0] + "." + parts[1]));
  if (!ok) throw new Error("the Ed25519 signature does not verify");
  const payload = new TextDecoder("utf-8", { fatal: true }).decode(b64urlDecode(parts[1]));
  const r = JSON.parse(payload);
  if (canonicalize(r) !== payload) throw new Error("the payload is not canonical JSON");
  for (const f of RECEIPT_REQUIRED) if (!(f in r)) throw new Error("the receipt has no " + f);
  for (const f of Object.keys(r)) {
    if (!RECEIPT_REQUIRED.includes(f) && !RECEIPT_OPTIONAL.includes(f)) throw new Error("unknown receipt field " + f);
  }
  return { receipt: r, pub };
}
function checkSummary(body) {
  for (const f of [...RECEIPT_REQUIRED, ...RECEIPT_OPTIONAL]) {
    const x = body[f];
    if (!Object.hasOwn(body, f) || x === null) continue;
    const ok = f === "risk_score" ? typeof x === "number" : f === "ledger_seq" ? Number.isInteger(x) && x >= 0 && x < 2 ** 64 : typeof x === "string";
    if (!ok) throw new Error("the body's " + f + " is " + JSON.stringify(x) + ", not of its type");
  }
}
var AGREEING = [
  "operation_id",
  "tool_id",
  "agent_id",
  "capability_token_id",
  "args_hash",
  "result_hash",
  "tx_outcome",
  "commit_delta_id",
  "policy_hash",
  "autonomy_mode",
  "risk_score",
  "error_class"
];
function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}
async function jwksKeys(jwks2) {
  if (isText(jwks2)) jwks2 = parseStrict(jwks2);
  if (!isObject(jwks2) || !Array.isArray(jwks2.keys)) throw new Error("the JWKS has no keys array");
  const out = [];
  for (const [i, k] of jwks2.keys.entries()) {
    const n = "JWKS key " + (i + 1);
    if (!isObject(k)) throw new Error(n + " is not an object");
    if (k.kty !== "OKP" || k.crv !== "Ed25519" || Object.hasOwn(k, "use") && k.use !== "sig" || Object.hasOwn(k, "alg") && k.alg !== "EdDSA") continue;
    if (Object.hasOwn(k, "d")) throw new Error(n + " holds a private key (d)");
    if (typeof k.x !== "string" || k.x === "") throw new Error(n + " has no x string");
    const pub = b64urlDecode(k.x);
    if (pub.length !== 32) throw new Error(n + ": x is " + pub.length + " bytes, want 32");
    const kid = await thumbprint(pub);
    if (k.kid !== kid) throw new Error(n + ": kid " + JSON.stringify(k.kid) + " is not the key's thumbprint " + kid);
    if (out.some((o) => o.kid === kid)) throw new Error("JWKS keys " + JSON.stringify(kid) + ": two Ed25519 keys have this kid");
    out.push({ kid, pub });
  }
  if (out.length === 0) throw new Error("the JWKS holds no Ed25519 signature key");
  return out;
}
function receiptID(seq, h) {
  return "r" + seq + "-" + h.slice(7, 23);
}
var INCLUSION_FIELDS = ["leaf_hash", "leaf_index", "proof", "tree_size"];
function checkInclusion(inc, entry, cp) {
  const got = isObject(inc) ? Object.keys(inc).sort() : [];
  if (got.join() !== INCLUSION_FIELDS.join()) throw new Error("inclusion members are " + got.join(",") + ", want " + INCLUSION_FIELDS.join(","));
  if (inc.leaf_index !== entry.seq) throw new Error("leaf_index " + inc.leaf_index + " is not the entry's seq " + entry.seq);
  if (inc.leaf_hash !== entry.entry_hash) throw new Error("leaf_hash is not the entry's hash");
  if (inc.tree_size !== cp.size) throw new Error("tree_size " + inc.tree_size + " is not the checkpoint's size " + cp.size);
  if (!Array.isArray(inc.proof)) throw new Error("proof is not a list");
  const root = rootFromInclusion(inc.leaf_index, inc.tree_size, parseHash(inc.leaf_hash, "leaf_hash"), inc.proof.map((p) => parseHash(p, "a proof hash")));
  if (!equalBytes(root, cp.root)) throw new Error("the proof leads to " + hex(root) + ", not the checkpoint's root " + hex(cp.root));
  return "leaf " + inc.leaf_index + " of " + inc.tree_size + ", " + inc.proof.length + " hashes";
}
var CHECKS_V2 = [
  ["entry", "Audit entry well formed, canonical, entry_hash recomputes (BLAKE3)"],
  ["checkpoint", "Checkpoint signed by a key of the kernel's JWKS (Ed25519)"],
  ["inclusion", "Inclusion proof leads to the checkpoint's root"]
];
var V2_FIELDS = ["checkpoint", "entry", "format", "inclusion"];
async function verifyLogged(receipt, jwks2, run) {
  let entry, cp;
  const entryOK = await run("entry", async () => {
    const got = Object.keys(receipt).sort();
    if (got.join() !== V2_FIELDS.join()) throw new Error("receipt members are " + got.join(",") + ", want " + V2_FIELDS.join(","));
    if (typeof receipt.entry !== "string") throw new Error("entry is not a string");
    entry = parseEntry(receipt.entry);
    if (entry.kind !== "audit") throw new Error("the entry is of kind " + entry.kind + ", not audit");
    checkSummary(entry.body);
    return "receipt " + receiptID(entry.seq, entry.entry_hash) + ": " + entry.body.tool_id + " by " + entry.body.agent_id + ", seq " + entry.seq;
  });
  const cpOK = await run("checkpoint", async () => {
    if (typeof receipt.checkpoint !== "string") throw new Error("checkpoint is not a string");
    let last;
    for (const { pub } of await jwksKeys(jwks2)) {
      try {
        cp = await verifyCheckpoint(receipt.checkpoint, pub);
        return cp.origin + " size " + cp.size + ", signed by " + await thumbprint(pub);
      } catch (e) {
        last = e;
      }
    }
    throw last;
  });
  if (entryOK && cpOK) await run("inclusion", async () => checkInclusion(receipt.inclusion, entry, cp));
}
var CHECKS = [
  ["jws", "Receipt signature (Ed25519, JWKS key, exact header and payload)"],
  ["entry", "Ledger entry well formed, canonical, entry_hash recomputes (BLAKE3)"],
  ["agreement", "Entry agrees with the receipt"],
  ["checkpoint", "Checkpoint signed by the kernel's key"],
  ["inclusion", "Inclusion proof leads to the checkpoint's root"]
];
function isText(doc) {
  return typeof doc === "string" || doc instanceof Uint8Array || doc instanceof ArrayBuffer;
}
async function verifyBundle(bundle, jwks2) {
  if (isText(bundle)) {
    try {
      bundle = parseStrict(bundle, { plainIntegers: true });
    } catch (e) {
      const checks2 = CHECKS_V2.map(([id, label]) => ({ id, label, ok: null, detail: "skipped: an earlier check failed" }));
      Object.assign(checks2[0], { ok: false, detail: "the receipt: " + e.message });
      return { ok: false, format: void 0, checks: checks2 };
    }
  }
  const v2 = bundle && bundle.format === RECEIPT_FORMAT;
  const checks = (v2 ? CHECKS_V2 : CHECKS).map(([id, label]) => ({ id, label, ok: null, detail: "skipped: an earlier check failed" }));
  const set = (id, ok, detail) => Object.assign(checks.find((c) => c.id === id), { ok, detail });
  const run = async (id, fn) => {
    try {
      set(id, true, await fn() || "ok");
      return true;
    } catch (e) {
      set(id, false, e.message || String(e));
      return false;
    }
  };
  if (v2) {
    await verifyLogged(bundle, jwks2, run);
    return { ok: checks.every((c) => c.ok === true), format: RECEIPT_FORMAT, checks };
  }
  let receipt, pub, entry, cp;
  if (!bundle || bundle.format !== BUNDLE_FORMAT) {
    set("jws", false, "not a " + RECEIPT_FORMAT + " receipt nor a " + BUNDLE_FORMAT + " bundle");
    return { ok: false, format: bundle && bundle.format, checks };
  }
  const jwsOK = await run("jws", async () => {
    ({ receipt, pub } = await verifyReceipt(bundle.receipt, jwks2));
    return "receipt " + receipt.receipt_id + " signed by " + await thumbprint(pub);
  });
  const entryOK = await run("entry", async () => {
    if (typeof bundle.entry !== "string") throw new Error("entry is not a string");
    entry = parseEntry(bundle.entry);
    if (entry.kind !== "audit") throw new Error("the entry is of kind " + entry.kind + ", not audit");
    return "seq " + entry.seq + ", " + entry.entry_hash;
  });
  if (jwsOK && entryOK) {
    await run("agreement", async () => {
      if (receipt.ledger_seq !== entry.seq) throw new Error("ledger_seq " + receipt.ledger_seq + " is not the entry's seq " + entry.seq);
      if (receipt.ledger_entry_hash !== entry.entry_hash) throw new Error("ledger_entry_hash is not the entry's hash");
      for (const f of AGREEING) {
        if (canonicalize(receipt[f] ?? null) !== canonicalize(entry.body[f] ?? null)) {
          throw new Error(f + ": receipt " + JSON.stringify(receipt[f]) + ", entry " + JSON.stringify(entry.body[f]));
        }
      }
      return AGREEING.length + 2 + " fields agree";
    });
  }
  const cpOK = jwsOK && await run("checkpoint", async () => {
    cp = await verifyCheckpoint(bundle.checkpoint, pub);
    return cp.origin + " size " + cp.size;
  });
  if (cpOK && entryOK) {
    await run("inclusion", async () => checkInclusion(bundle.inclusion, entry, cp));
  }
  return { ok: checks.every((c) => c.ok === true), format: BUNDLE_FORMAT, checks };
}

// src/witness.js
var STATE = "capkernel.console.checkpoints";
var LEGACY = "capkernel.console.checkpoint";
async function signerOf(note, keys2) {
  const cp = parseCheckpoint(note);
  for (const key of keys2) {
    const id = await noteKeyID(cp.origin, key.pub);
    if (cp.sigs.some((s) => s.name === cp.origin && hex(s.keyID) === hex(id))) return { key, cp: await verifyCheckpoint(note, key.pub) };
  }
  throw new Error("no key of the JWKS signs the checkpoint under its origin " + JSON.stringify(cp.origin));
}
function load(store) {
  try {
    const st = JSON.parse(store.getItem(STATE) || "{}");
    if (st && typeof st.keys === "object" && st.keys !== null) return st;
  } catch {
  }
  return { keys: {} };
}
async function legacyOf(store, key) {
  const note = store.getItem(LEGACY);
  if (!note) return null;
  let origin;
  try {
    origin = parseCheckpoint(note).origin;
  } catch {
    return null;
  }
  const mine = await verifyCheckpoint(note, key.pub).then(() => true, () => false);
  return { note, origin, mine };
}
async function witness(note, jwks2, store, prove, now = /* @__PURE__ */ new Date()) {
  const checks = [];
  const { key, cp } = await signerOf(note, await jwksKeys(jwks2));
  checks.push(["Signature by the kernel's key", true, `${cp.origin}, key ${key.kid}`]);
  const label = "Consistent with the last one seen";
  const st = load(store);
  const legacy = await legacyOf(store, key);
  let seen = Object.hasOwn(st.keys, key.kid) ? st.keys[key.kid] : null;
  if (!seen && legacy?.mine) seen = { origin: legacy.origin, note: legacy.note, seen_at: "an earlier visit" };
  let remember = true;
  let other = Object.entries(st.keys).find(([kid, r]) => kid !== key.kid && r.origin === cp.origin);
  if (!other && legacy && !legacy.mine && legacy.origin === cp.origin) other = ["(another key)", { seen_at: "an earlier visit" }];
  try {
    if (seen && seen.origin !== cp.origin) {
      const old = parseCheckpoint(seen.note);
      throw new Error(`ORIGIN CHANGED: key ${key.kid} signed the checkpoint of origin ${JSON.stringify(seen.origin)} (size ${old.size}) seen at ${seen.seen_at}, and now one of origin ${JSON.stringify(cp.origin)} (size ${cp.size}): a key signs one ledger, so this is another history under a new name`);
    }
    if (!seen && other) {
      throw new Error(`KEY CHANGED: origin ${JSON.stringify(cp.origin)} was seen signed by key ${other[0]} at ${other[1].seen_at}, and is now signed by key ${key.kid}`);
    }
    if (!seen) {
      checks.push([label, null, "first checkpoint this browser has seen for this key"]);
    } else {
      const old = await verifyCheckpoint(seen.note, key.pub).catch((e) => {
        throw new Error("the remembered checkpoint does not verify: " + e.message);
      });
      if (cp.size < old.size) {
        verifyConsistency(cp.size, old.size, cp.root, old.root, await prove(cp.size, old.size));
        checks.push([label, true, `older than the checkpoint of size ${old.size} seen at ${seen.seen_at}, which is proved an extension of it; that one stays remembered`]);
        remember = false;
      } else if (cp.size === old.size) {
        if (hex(cp.root) !== hex(old.root)) throw new Error(`FORK: two signed checkpoints of size ${cp.size} with roots ${hex(old.root)} (seen at ${seen.seen_at}) and ${hex(cp.root)}`);
        checks.push([label, true, `same as the checkpoint seen at ${seen.seen_at}`]);
      } else {
        verifyConsistency(old.size, cp.size, old.root, cp.root, await prove(old.size, cp.size));
        checks.push([label, true, `size ${old.size} → ${cp.size}, proved an extension of the checkpoint seen at ${seen.seen_at}`]);
      }
    }
  } catch (e) {
    checks.push([label, false, e.message]);
    remember = false;
  }
  if (remember) {
    st.keys[key.kid] = { origin: cp.origin, note, seen_at: now.toISOString() };
    store.setItem(STATE, JSON.stringify(st));
    if (legacy?.mine) store.removeItem(LEGACY);
  }
  return { checks, kid: key.kid, remembered: remember };
}

// src/commitments.js
var PARTS = ["args", "result", "policy_input", "context"];
var CONTEXT = "capkernel audit commitment v1 ";
var enc2 = new TextEncoder();
var TAMPERED = ["mismatch", "missing"];
function payloadState(rec) {
  const depth = rec.entry.body.payload_depth;
  const p = rec.entry.payload;
  if (rec.erasure) return { state: "erased", message: "Erased: the payload was removed, and the record still verifies by its commitments." };
  if (!rec.full) return { state: "withheld", message: "Withheld: your credential reads another agent's record only as its public part (its commitments)." };
  if (depth === "commitments_only") {
    return { state: "not_kept", message: "Commitments only: nothing is kept, not even the salt; the agent holds the salt in the result envelope its call returned." };
  }
  if (!p && depth) return { state: "missing", message: "No payload kept, and no erasure record names this record." };
  if (!p) return { state: "none", message: "This record predates commitments: its parts are in its body." };
  return { state: "kept", message: "Kept beside the chain:" };
}
function partKey(salt, part) {
  if (typeof salt !== "string" || !/^[0-9a-f]{64}$/.test(salt)) throw new Error("the salt is not 32 bytes of lowercase hex");
  return blake3(unhex(salt), { context: enc2.encode(CONTEXT + part) });
}
function commit(key, bytes) {
  return "blake3:" + hex(blake3(bytes, { key }));
}
function commitPart(salt, part, value) {
  return commit(partKey(salt, part), enc2.encode(canonicalize(value)));
}
function openPayload(body, payload, { erased = false, withheld = false } = {}) {
  const parts = PARTS.map((part) => {
    const want = body[part + "_commitment"];
    const got = payload ? payload[part] : void 0;
    const r = { part, commitment: want || "", state: "", detail: "" };
    if (!want && got === void 0) r.state = "absent";
    else if (!want) Object.assign(r, { state: "mismatch", detail: "a part the record never committed to" });
    else if (got !== void 0) {
      try {
        const have = commitPart(payload.salt, part, got);
        if (have === want) Object.assign(r, { state: "matches", detail: "the payload opens the commitment" });
        else Object.assign(r, { state: "mismatch", detail: "the payload gives " + have });
      } catch (e) {
        Object.assign(r, { state: "mismatch", detail: e.message });
      }
    } else if (withheld) Object.assign(r, { state: "withheld", detail: "your credential reads this record only as its public part" });
    else if (erased) Object.assign(r, { state: "erased", detail: "removed by an erasure record" });
    else if (body.payload_depth === "commitments_only") Object.assign(r, { state: "not_kept", detail: "the record's depth keeps no parts" });
    else Object.assign(r, { state: "missing", detail: "committed, but neither kept nor erased" });
    return r;
  });
  const tampered = parts.some((p) => TAMPERED.includes(p.state));
  return { ok: !tampered, tampered, parts };
}

// node_modules/diff/libesm/diff/base.js
var Diff = class {
  diff(oldStr, newStr, options = {}) {
    let callback;
    if (typeof options === "function") {
      callback = options;
      options = {};
    } else if ("callback" in options) {
      callback = options.callback;
    }
    const oldString = this.castInput(oldStr, options);
    const newString = this.castInput(newStr, options);
    const oldTokens = this.removeEmpty(this.tokenize(oldString, options));
    const newTokens = this.removeEmpty(this.tokenize(newString, options));
    return this.diffWithOptionsObj(oldTokens, newTokens, options, callback);
  }
  diffWithOptionsObj(oldTokens, newTokens, options, callback) {
    var _a;
    const done = (value) => {
      value = this.postProcess(value, options);
      if (callback) {
        setTimeout(function() {
          callback(value);
        }, 0);
        return void 0;
      } else {
        return value;
      }
    };
    const newLen = newTokens.length, oldLen = oldTokens.length;
    let editLength = 1;
    let maxEditLength = newLen + oldLen;
    if (options.maxEditLength != null) {
      maxEditLength = Math.min(maxEditLength, options.maxEditLength);
    }
    const maxExecutionTime = (_a = options.timeout) !== null && _a !== void 0 ? _a : Infinity;
    const abortAfterTimestamp = Date.now() + maxExecutionTime;
    const bestPath = [{ oldPos: -1, lastComponent: void 0 }];
    let newPos = this.extractCommon(bestPath[0], newTokens, oldTokens, 0, options);
    if (bestPath[0].oldPos + 1 >= oldLen && newPos + 1 >= newLen) {
      return done(this.buildValues(bestPath[0].lastComponent, newTokens, oldTokens));
    }
    let minDiagonalToConsider = -Infinity, maxDiagonalToConsider = Infinity;
    const execEditLength = () => {
      for (let diagonalPath = Math.max(minDiagonalToConsider, -editLength); diagonalPath <= Math.min(maxDiagonalToConsider, editLength); diagonalPath += 2) {
        let basePath;
        const removePath = bestPath[diagonalPath - 1], addPath = bestPath[diagonalPath + 1];
        if (removePath) {
          bestPath[diagonalPath - 1] = void 0;
        }
        let canAdd = false;
        if (addPath) {
          const addPathNewPos = addPath.oldPos - diagonalPath;
          canAdd = addPath && 0 <= addPathNewPos && addPathNewPos < newLen;
        }
        const canRemove = removePath && removePath.oldPos + 1 < oldLen;
        if (!canAdd && !canRemove) {
          bestPath[diagonalPath] = void 0;
          continue;
        }
        if (!canRemove || canAdd && removePath.oldPos < addPath.oldPos) {
          basePath = this.addToPath(addPath, true, false, 0, options);
        } else {
          basePath = this.addToPath(removePath, false, true, 1, options);
        }
        newPos = this.extractCommon(basePath, newTokens, oldTokens, diagonalPath, options);
        if (basePath.oldPos + 1 >= oldLen && newPos + 1 >= newLen) {
          return done(this.buildValues(basePath.lastComponent, newTokens, oldTokens)) || true;
        } else {
          bestPath[diagonalPath] = basePath;
          if (basePath.oldPos + 1 >= oldLen) {
            maxDiagonalToConsider = Math.min(maxDiagonalToConsider, diagonalPath - 1);
          }
          if (newPos + 1 >= newLen) {
            minDiagonalToConsider = Math.max(minDiagonalToConsider, diagonalPath + 1);
          }
        }
      }
      editLength++;
    };
    if (callback) {
      (function exec() {
        setTimeout(function() {
          if (editLength > maxEditLength || Date.now() > abortAfterTimestamp) {
            return callback(void 0);
          }
          if (!execEditLength()) {
            exec();
          }
        }, 0);
      })();
    } else {
      while (editLength <= maxEditLength && Date.now() <= abortAfterTimestamp) {
        const ret = execEditLength();
        if (ret) {
          return ret;
        }
      }
    }
  }
  addToPath(path, added, removed, oldPosInc, options) {
    const last = path.lastComponent;
    if (last && !options.oneChangePerToken && last.added === added && last.removed === removed) {
      return {
        oldPos: path.oldPos + oldPosInc,
        lastComponent: { count: last.count + 1, added, removed, previousComponent: last.previousComponent }
      };
    } else {
      return {
        oldPos: path.oldPos + oldPosInc,
        lastComponent: { count: 1, added, removed, previousComponent: last }
      };
    }
  }
  extractCommon(basePath, newTokens, oldTokens, diagonalPath, options) {
    const newLen = newTokens.length, oldLen = oldTokens.length;
    let oldPos = basePath.oldPos, newPos = oldPos - diagonalPath, commonCount = 0;
    while (newPos + 1 < newLen && oldPos + 1 < oldLen && this.equals(oldTokens[oldPos + 1], newTokens[newPos + 1], options)) {
      newPos++;
      oldPos++;
      commonCount++;
      if (options.oneChangePerToken) {
        basePath.lastComponent = { count: 1, previousComponent: basePath.lastComponent, added: false, removed: false };
      }
    }
    if (commonCount && !options.oneChangePerToken) {
      basePath.lastComponent = { count: commonCount, previousComponent: basePath.lastComponent, added: false, removed: false };
    }
    basePath.oldPos = oldPos;
    return newPos;
  }
  equals(left, right, options) {
    if (options.comparator) {
      return options.comparator(left, right);
    } else {
      return left === right || !!options.ignoreCase && left.toLowerCase() === right.toLowerCase();
    }
  }
  removeEmpty(array) {
    const ret = [];
    for (let i = 0; i < array.length; i++) {
      if (array[i]) {
        ret.push(array[i]);
      }
    }
    return ret;
  }
  // eslint-disable-next-line @typescript-eslint/no-unused-vars
  castInput(value, options) {
    return value;
  }
  // eslint-disable-next-line @typescript-eslint/no-unused-vars
  tokenize(value, options) {
    return Array.from(value);
  }
  join(chars) {
    return chars.join("");
  }
  postProcess(changeObjects, options) {
    return changeObjects;
  }
  get useLongestToken() {
    return false;
  }
  buildValues(lastComponent, newTokens, oldTokens) {
    const components = [];
    let nextComponent;
    while (lastComponent) {
      components.push(lastComponent);
      nextComponent = lastComponent.previousComponent;
      delete lastComponent.previousComponent;
      lastComponent = nextComponent;
    }
    components.reverse();
    const componentLen = components.length;
    let componentPos = 0, newPos = 0, oldPos = 0;
    for (; componentPos < componentLen; componentPos++) {
      const component = components[componentPos];
      if (!component.removed) {
        if (!component.added && this.useLongestToken) {
          let value = newTokens.slice(newPos, newPos + component.count);
          value = value.map(function(value2, i) {
            const oldValue = oldTokens[oldPos + i];
            return oldValue.length > value2.length ? oldValue : value2;
          });
          component.value = this.join(value);
        } else {
          component.value = this.join(newTokens.slice(newPos, newPos + component.count));
        }
        newPos += component.count;
        if (!component.added) {
          oldPos += component.count;
        }
      } else {
        component.value = this.join(oldTokens.slice(oldPos, oldPos + component.count));
        oldPos += component.count;
      }
    }
    return components;
  }
};

// node_modules/diff/libesm/diff/line.js
var LineDiff = class extends Diff {
  constructor() {
    super(...arguments);
    this.tokenize = tokenize;
  }
  equals(left, right, options) {
    if (options.ignoreWhitespace) {
      if (!options.newlineIsToken || !left.includes("\n")) {
        left = left.trim();
      }
      if (!options.newlineIsToken || !right.includes("\n")) {
        right = right.trim();
      }
    } else if (options.ignoreNewlineAtEof && !options.newlineIsToken) {
      if (left.endsWith("\n")) {
        left = left.slice(0, -1);
      }
      if (right.endsWith("\n")) {
        right = right.slice(0, -1);
      }
    }
    return super.equals(left, right, options);
  }
};
var lineDiff = new LineDiff();
function diffLines(oldStr, newStr, options) {
  return lineDiff.diff(oldStr, newStr, options);
}
function tokenize(value, options) {
  if (options.stripTrailingCr) {
    value = value.replace(/\r\n/g, "\n");
  }
  const retLines = [], linesAndNewlines = value.split(/(\n|\r\n)/);
  if (!linesAndNewlines[linesAndNewlines.length - 1]) {
    linesAndNewlines.pop();
  }
  for (let i = 0; i < linesAndNewlines.length; i++) {
    const line = linesAndNewlines[i];
    if (i % 2 && !options.newlineIsToken) {
      retLines[retLines.length - 1] += line;
    } else {
      retLines.push(line);
    }
  }
  return retLines;
}

// src/changes.js
var MAX_EDIT_LINES = 2e3;
var DIFF_TIMEOUT_MS = 300;
var MAX_SHOWN_LINES = 5e3;
function countLines(text) {
  if (text === "") return 0;
  let n = 1;
  for (let i = text.indexOf("\n"); i >= 0 && i < text.length - 1; i = text.indexOf("\n", i + 1)) n++;
  return n;
}
function lineChanges(before, after, { timeout = DIFF_TIMEOUT_MS } = {}) {
  if (before === "" && after === "") return [];
  if (before === "") return [{ value: after, added: true, removed: false }];
  if (after === "") return [{ value: before, added: false, removed: true }];
  return diffLines(before, after, { maxEditLength: MAX_EDIT_LINES, timeout }) ?? null;
}
function changeRows(parts, max = MAX_SHOWN_LINES) {
  const rows = [];
  let hidden = 0;
  for (const part of parts) {
    const kind = part.added ? "add" : part.removed ? "del" : "ctx";
    const lines = part.value.replace(/\n$/, "").split("\n");
    const room = Math.max(0, max - rows.length);
    for (const text of lines.slice(0, room)) rows.push({ kind, text });
    hidden += Math.max(0, lines.length - room);
  }
  return { rows, hidden };
}
function firstLines(text, max = MAX_SHOWN_LINES) {
  let end = -1;
  for (let n = 0; n < max; n++) {
    end = text.indexOf("\n", end + 1);
    if (end < 0 || end === text.length - 1) return { text, hidden: 0 };
  }
  return { text: text.slice(0, end + 1), hidden: countLines(text) - max };
}

// src/app.js
var $ = (sel) => document.querySelector(sel);
var session = null;
var events = null;
var KEY = "capkernel.console.key";
var KEY_HEADER = "X-Console-Key";
var pending = /* @__PURE__ */ new Map();
var decided = /* @__PURE__ */ new Map();
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === void 0 || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c !== void 0 && c !== null) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}
function say(msg, error = false) {
  const s = $("#status");
  s.textContent = msg;
  s.classList.toggle("error", error);
}
var APIError = class extends Error {
  constructor(status, body) {
    super(body && body.error || "HTTP " + status);
    this.status = status;
    this.body = body;
  }
};
function keyHeaders() {
  const key = sessionStorage.getItem(KEY);
  return key ? { [KEY_HEADER]: key } : {};
}
async function api(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: keyHeaders() };
  if (method !== "GET") {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body ?? {});
  }
  const resp = await fetch(path, opts);
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (resp.status === 401 && path !== "/console/api/login" && path !== "/console/api/session") {
    signedOut("The session has ended; sign in again.");
  }
  if (!resp.ok) throw new APIError(resp.status, data);
  return data;
}
function kv(pairs) {
  const dl = el("dl", { class: "kv" });
  for (const [k, v] of pairs) {
    if (v === void 0 || v === null || v === "") continue;
    dl.append(el("dt", {}, k), el("dd", {}, v));
  }
  return dl;
}
function fmtTime(s) {
  if (!s) return "";
  const d = new Date(s);
  return isNaN(d) ? s : d.toLocaleString();
}
var views = ["login", "approvals", "history", "verify", "ledger", "tokens"];
function show(view) {
  for (const v of views) $("#view-" + v).hidden = v !== view;
  for (const b of document.querySelectorAll("#nav button")) {
    if (b.dataset.view === view) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
  }
  if (view === "tokens") loadTokens();
  if (view === "ledger") refreshCheckpoint();
  if (view === "history" && !$("#history-table tbody").children.length) searchHistory();
}
function signedIn(s) {
  session = { ...s, canDecide: s.can_decide };
  $("#view-login").hidden = true;
  $("#nav").hidden = false;
  $("#who").hidden = false;
  $("#who-text").textContent = `${s.subject} (${s.role})`;
  for (const b of document.querySelectorAll("#nav [data-reads-all]")) b.hidden = !s.reads_all;
  show("approvals");
  loadApprovals();
  connectEvents();
  $("#main").focus();
}
function signedOut(msg) {
  session = null;
  sessionStorage.removeItem(KEY);
  if (events) events.abort();
  events = null;
  pending.clear();
  touched.clear();
  decided.clear();
  $("#nav").hidden = true;
  $("#who").hidden = true;
  show("login");
  if (msg) say(msg, true);
  $("#credential").focus();
}
var loads = 0;
var touched = /* @__PURE__ */ new Map();
async function loadApprovals() {
  const load2 = ++loads;
  try {
    const out = await api("GET", "/console/api/approvals?all=true");
    session.canDecide = out.can_decide;
    const listed = /* @__PURE__ */ new Set();
    for (const a of out.approvals) {
      listed.add(a.approval_id);
      if ((touched.get(a.approval_id) ?? 0) >= load2) continue;
      if (a.state === "pending") pending.set(a.approval_id, a);
      else {
        pending.delete(a.approval_id);
        decided.set(a.approval_id, a);
      }
    }
    for (const id of [...pending.keys()]) if (!listed.has(id) && (touched.get(id) ?? 0) < load2) pending.delete(id);
    renderApprovals();
  } catch (e) {
    say("Loading approvals failed: " + e.message, true);
  }
}
function renderApprovals() {
  const list = $("#approvals-list");
  const keep = new Set(pending.keys());
  for (const li of [...list.children]) {
    if (keep.has(li.dataset.id)) continue;
    detailWatch.unobserve(li.querySelector(".detail"));
    li.remove();
  }
  for (const a of pending.values()) {
    if (!list.querySelector(`[data-id="${CSS.escape(a.approval_id)}"]`)) list.append(approvalCard(a));
  }
  $("#approvals-empty").hidden = pending.size > 0;
  $("#pending-count").textContent = String(pending.size);
  const dl = $("#decided-list");
  dl.replaceChildren(...[...decided.values()].reverse().slice(0, 50).map(decidedCard));
}
function approvalCard(a) {
  const id = a.approval_id;
  const reasonID = "reason-" + id;
  const li = el("li", { class: "card" + (a.autonomy_mode === "escalated" ? " escalated" : ""), "data-id": id, "aria-labelledby": "h-" + id });
  const detail = el("div", { class: "detail" }, "Loading the arguments…");
  li.append(
    el("h3", { id: "h-" + id }, `${a.tool_id} by ${a.agent_id}`),
    kv([
      ["Session", a.session_id],
      ["Class", a.side_effect],
      ["Mode", a.autonomy_mode + (a.required_role === "escalation" ? " (escalation approvers only)" : "")],
      ["Risk", `${a.risk_score}${a.risk_basis && a.risk_basis.length ? " — " + a.risk_basis.join("; ") : ""}`],
      ["Effects", (a.projected_effects || []).join(", ")],
      ["Policy", a.policy_hash],
      ["Operation", a.operation_id],
      ["Requested", fmtTime(a.requested_at)],
      ["Expires", fmtTime(a.decide_by)]
    ]),
    detail
  );
  if (session.canDecide) {
    const reason = el("textarea", { id: reasonID, rows: 2 });
    const allow = el("button", { type: "button", class: "allow" }, "Approve");
    const deny = el("button", { type: "button", class: "deny" }, "Deny");
    const decide = async (decision) => {
      allow.disabled = deny.disabled = true;
      try {
        const out = await api("POST", "/console/api/approvals/" + encodeURIComponent(id), { decision, reason: reason.value });
        resolved(out);
        say(`${decision === "allow" ? "Approved" : "Denied"} ${a.tool_id} by ${a.agent_id}.`);
      } catch (e) {
        if (e.status === 409 && e.body && e.body.approval) {
          resolved(e.body.approval);
          say(`Someone decided first: ${e.body.approval.state} by ${e.body.approval.decided_by || "nobody"}.`, true);
        } else {
          allow.disabled = deny.disabled = false;
          say("The decision failed: " + e.message, true);
        }
      }
    };
    allow.addEventListener("click", () => decide("allow"));
    deny.addEventListener("click", () => decide("deny"));
    li.append(el("label", { for: reasonID }, "Reason"), reason, el("div", { class: "buttons" }, allow, deny));
  } else {
    li.append(el("p", { class: "read-only" }, "Read-only: your credential cannot decide approvals."));
  }
  detail.dataset.approval = id;
  detailWatch.observe(detail);
  return li;
}
var detailWatch = new IntersectionObserver((seen) => {
  for (const e of seen) {
    if (!e.isIntersecting) continue;
    detailWatch.unobserve(e.target);
    loadDetail(e.target.dataset.approval, e.target);
  }
}, { rootMargin: "200px" });
async function loadDetail(id, box) {
  try {
    const d = await api("GET", "/console/api/approvals/" + encodeURIComponent(id));
    box.replaceChildren(el("h4", {}, "Arguments"), el("pre", {}, JSON.stringify(d.args, null, 2)));
    for (const f of d.files || []) box.append(fileDiff(d.tool_id, d.args, f));
  } catch (e) {
    box.textContent = e.status === 404 ? "Decided already." : "Loading the arguments failed: " + e.message;
  }
}
function fileDiff(tool, args, f) {
  const spelled = f.spelled ? `, spelled ${f.spelled}` : "";
  const state = f.dir ? "directory" : f.link !== void 0 ? "symbolic link" : f.exists ? "now " + f.size + " bytes" : "new file";
  const title = el("h4", {}, `${f.path} (${state}${spelled})`);
  if (f.dir) {
    const more = f.more ? " or more" : "";
    return el("div", {}, title, el("p", { class: "dir" }, `A directory of ${f.entries || 0}${more} entries (at any depth), ${f.size}${more} bytes in files.`));
  }
  if (f.link !== void 0) {
    const note = el("p", {}, `A symbolic link to ${f.link}: the call replaces or removes the link itself, not what it leads to.`);
    if (tool !== "fs.write" || typeof args.content !== "string") return el("div", {}, title, note);
    return el("div", {}, title, note, diffBox(f.path, lineChanges("", args.content)));
  }
  if (f.binary || f.truncated) return el("div", {}, title, el("p", {}, f.truncated ? "Too large to show." : "Not text: no diff."));
  const before = f.exists ? f.content || "" : "";
  let after;
  if (tool === "fs.write" && typeof args.content === "string") after = args.content;
  else if (tool === "fs.patch" && typeof args.old === "string" && typeof args.new === "string") {
    const i = before.indexOf(args.old);
    if (i < 0) return el("div", {}, title, el("p", {}, "The text to replace is not in the current file: the call will fail."));
    after = before.slice(0, i) + args.new + before.slice(i + args.old.length);
  } else {
    return el("div", {}, title, shownText(before));
  }
  const parts = lineChanges(before, after);
  if (!parts) {
    return el(
      "div",
      {},
      title,
      el("p", { class: "too-different" }, `Too different to diff here: ${countLines(before)} lines before, ${countLines(after)} after. The new content:`),
      shownText(after)
    );
  }
  return el("div", {}, title, diffBox(f.path, parts));
}
function diffBox(path, parts) {
  const { rows, hidden } = changeRows(parts);
  const box = el("div", { class: "diff", role: "region", "aria-label": "Diff of " + path });
  for (const r of rows) {
    const sign = r.kind === "add" ? "+" : r.kind === "del" ? "-" : " ";
    box.append(el("div", { class: r.kind }, el("span", { class: "sr-only" }, r.kind === "add" ? "added: " : r.kind === "del" ? "removed: " : ""), sign + " " + r.text));
  }
  return hidden ? el("div", {}, box, el("p", { class: "hidden-lines" }, `${hidden} more lines not shown here (the arguments above hold the whole call).`)) : box;
}
function shownText(text) {
  const { text: shown, hidden } = firstLines(text);
  const pre = el("pre", { class: "content" }, shown);
  return hidden ? el("div", {}, pre, el("p", { class: "hidden-lines" }, `${hidden} more lines not shown here (the arguments above hold the whole call).`)) : pre;
}
function decidedCard(a) {
  return el(
    "li",
    { class: "card", "data-id": a.approval_id },
    el("h3", {}, `${a.tool_id} by ${a.agent_id}`),
    el("p", {}, el("span", { class: "state " + a.state }, a.state), a.decided_by ? ` by ${a.decided_by}` : "", a.reason ? ` — ${a.reason}` : ""),
    kv([["Decided", fmtTime(a.decided_at)], ["Approval valid until", fmtTime(a.expires_at)], ["Operation", a.operation_id]])
  );
}
function resolved(a) {
  touched.set(a.approval_id, loads);
  pending.delete(a.approval_id);
  decided.set(a.approval_id, a);
  renderApprovals();
}
function connectEvents() {
  if (events) events.abort();
  events = new AbortController();
  streamEvents(events.signal);
}
var RECONNECT_MS = 3e3;
async function streamEvents(signal) {
  while (!signal.aborted) {
    try {
      const resp = await fetch("/console/api/events", { credentials: "same-origin", headers: keyHeaders(), signal });
      if (resp.status === 401) {
        if (!signal.aborted) signedOut("The session has ended; sign in again.");
        return;
      }
      if (resp.ok && resp.body) {
        if (session) loadApprovals();
        await readEvents(resp.body, signal);
      }
    } catch {
    }
    if (signal.aborted) return;
    await new Promise((r) => setTimeout(r, RECONNECT_MS));
  }
}
async function readEvents(body, signal) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "", kind = "", data = [];
  for (; ; ) {
    const { value, done } = await reader.read();
    if (done || signal.aborted) return;
    buf += value;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
      if (line === "") {
        if (data.length) onEvent(kind || "message", data.join("\n"));
        kind = "";
        data = [];
      } else if (line.startsWith("event:")) kind = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
  }
}
function onEvent(kind, data) {
  if (kind === "ended") {
    let why = "";
    try {
      why = JSON.parse(data).error;
    } catch {
    }
    signedOut("The session has ended" + (why ? ": " + why : "") + "; sign in again.");
    return;
  }
  if (kind === "dropped") {
    loadApprovals();
    return;
  }
  if (!kind.startsWith("tool.")) return;
  const e = JSON.parse(data);
  logEvent(e);
  if (kind === "tool.confirmation_requested" && e.approval) {
    touched.set(e.approval.approval_id, loads);
    pending.set(e.approval.approval_id, e.approval);
    renderApprovals();
  } else if (kind === "tool.confirmation_resolved" && e.approval) {
    resolved(e.approval);
  }
}
function logEvent(e) {
  const ol = $("#events");
  ol.prepend(el("li", {}, `${e.time} ${e.kind} ${e.tool_id} ${e.agent_id}${e.error_class ? " " + e.error_class : ""}${e.tx_outcome ? " " + e.tx_outcome : ""}`));
  while (ol.children.length > 200) ol.lastChild.remove();
}
var historyQuery = null;
function isoOf(local) {
  return local ? new Date(local).toISOString().replace(/\.\d+Z$/, "Z") : "";
}
async function searchHistory(more = false) {
  const f = new FormData($("#history-form"));
  if (!more) {
    historyQuery = new URLSearchParams();
    for (const k of ["agent", "tool", "outcome", "class"]) if (f.get(k)) historyQuery.set(k, f.get(k));
    for (const k of ["since", "until"]) if (f.get(k)) historyQuery.set(k, isoOf(f.get(k)));
    historyQuery.delete("after");
    $("#history-table tbody").replaceChildren();
  }
  try {
    const out = await api("GET", "/console/api/receipts?" + historyQuery);
    const tb = $("#history-table tbody");
    for (const r of out.receipts) {
      const rc = r.receipt;
      const outcome = rc.error_class ? `${rc.error_class} (${rc.tx_outcome})` : rc.tx_outcome;
      const tr = el(
        "tr",
        { class: "selectable", tabindex: 0, "data-receipt": r.receipt_id },
        el("td", {}, fmtTime(rc.issued_at)),
        el("td", {}, rc.tool_id),
        el("td", {}, rc.agent_id),
        el("td", {}, outcome),
        el("td", {}, rc.autonomy_mode),
        el("td", {}, el("code", {}, r.receipt_id.slice(0, 13)))
      );
      const open = () => showRecord(r, tr);
      tr.addEventListener("click", open);
      tr.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          open();
        }
      });
      tb.append(tr);
    }
    $("#history-more").hidden = !out.next;
    if (out.next) historyQuery.set("after", out.next);
    say(`${tb.children.length} receipts.`);
  } catch (e) {
    say("Search failed: " + e.message, true);
  }
}
var current = null;
async function showRecord(r, tr) {
  for (const x of document.querySelectorAll("#history-table tr[aria-selected]")) x.removeAttribute("aria-selected");
  tr.setAttribute("aria-selected", "true");
  current = r;
  $("#history-detail").hidden = false;
  $("#detail-id").textContent = r.receipt_id;
  $("#detail-checks").replaceChildren();
  $("#detail-receipt").textContent = JSON.stringify({ jws: r.jws, payload: r.receipt, withheld: r.withheld }, null, 2);
  $("#detail-operation").textContent = "Loading…";
  $("#detail-commitments").replaceChildren();
  $("#detail-commitments").removeAttribute("data-verdict");
  showPayload(r);
  try {
    const op = await api("GET", "/console/api/operations/" + encodeURIComponent(r.operation_id));
    $("#detail-operation").textContent = JSON.stringify(op, null, 2);
  } catch (e) {
    if (e.status === 404 && !(session && session.reads_all)) $("#detail-operation").textContent = "Withheld: the result is the call's payload, which your credential does not read.";
    else $("#detail-operation").textContent = e.status === 404 ? "No stored result (the call was refused before it was recorded as an operation)." : e.message;
  }
}
var currentRecord = null;
var PART_LABELS = { args: "Arguments", result: "Result", policy_input: "Policy input", context: "Context" };
async function showPayload(r) {
  const state = $("#detail-payload-state"), box = $("#detail-payload"), er = $("#detail-erasure");
  state.textContent = "Loading…";
  state.removeAttribute("data-state");
  box.replaceChildren();
  er.replaceChildren();
  currentRecord = null;
  try {
    const rec = await api("GET", "/console/api/receipts/" + encodeURIComponent(r.receipt_id) + "/record");
    if (current !== r) return;
    currentRecord = rec;
    const p = rec.entry.payload;
    const { state: st, message: msg } = payloadState(rec);
    if (st === "erased") {
      const b = rec.erasure.body;
      er.append(el("h5", {}, "Erasure record"), kv([
        ["Seq", rec.erasure.seq],
        ["Time", fmtTime(rec.erasure.time)],
        ["By", b.by],
        ["Reason", b.reason],
        ["Operation", b.operation_id],
        ["Records", (b.seqs || []).join(", ")]
      ]));
    } else if (st === "kept") {
      for (const part of PARTS) {
        if (p[part] !== void 0) box.append(el("h5", {}, PART_LABELS[part]), el("pre", { "data-part": part }, JSON.stringify(p[part], null, 2)));
      }
    }
    state.textContent = msg;
    state.setAttribute("data-state", st);
  } catch (e) {
    state.textContent = "Loading the record failed: " + e.message;
  }
}
async function openCurrent() {
  const box = $("#detail-commitments");
  box.removeAttribute("data-verdict");
  box.textContent = "Checking…";
  const rec = currentRecord;
  if (!rec) {
    box.textContent = "The record has not loaded.";
    return;
  }
  try {
    const bundle = await api("GET", `/console/api/receipts/${encodeURIComponent(current.receipt_id)}/bundle`);
    const proof = await verifyBundle(bundle, await jwks());
    if (!proof.ok) {
      renderChecks(box, proof);
      return;
    }
    const body = parseEntry(bundle.entry).body;
    const out = openPayload(body, rec.entry.payload || null, { erased: !!rec.erasure, withheld: !rec.full });
    const states = out.parts.map((p) => p.state);
    let verdict, cls;
    if (out.tampered) {
      cls = "fail";
      verdict = "Tampered: " + out.parts.filter((p) => p.state === "mismatch" || p.state === "missing").map((p) => PART_LABELS[p.part]).join(", ") + " do not open the record's commitments.";
    } else if (states.includes("erased")) {
      cls = "erased";
      verdict = `Erased, not tampered: the record is in the log; its payload was removed by erasure record ${rec.erasure.seq}.`;
    } else if (states.includes("withheld")) {
      cls = "withheld";
      verdict = "The record is in the log; its payload is withheld from your credential, so its commitments cannot be opened here.";
    } else {
      cls = "pass";
      verdict = "Verified: the record is in the log and commits to exactly this payload.";
    }
    const ul = el("ul", { class: "checks" });
    for (const p of out.parts) {
      const c = p.state === "matches" ? "pass" : p.state === "mismatch" || p.state === "missing" ? "fail" : "skip";
      ul.append(el(
        "li",
        { class: c, "data-part": p.part, "data-state": p.state },
        el("strong", {}, `${PART_LABELS[p.part]}: ${p.state.replace("_", " ")}`),
        el("br"),
        p.commitment ? el("code", {}, p.commitment) : "no commitment",
        p.detail ? el("br") : "",
        p.detail
      ));
    }
    box.replaceChildren(el("p", { class: "verdict " + (cls === "fail" ? "fail" : cls === "pass" ? "pass" : "") }, verdict), ul);
    box.setAttribute("data-verdict", cls);
  } catch (e) {
    box.textContent = "The check failed to run: " + e.message;
  }
}
async function jwks() {
  const resp = await fetch("/.well-known/jwks.json", { credentials: "omit" });
  if (!resp.ok) throw new Error("fetching the JWKS: HTTP " + resp.status);
  return resp.json();
}
function renderChecks(box, result) {
  const verdict = el("p", { class: "verdict " + (result.ok ? "pass" : "fail") }, result.ok ? "Verified: every check passed." : "Not verified: " + (result.checks.find((c) => c.ok === false) || {}).label + " failed.");
  const ul = el("ul", { class: "checks" });
  for (const c of result.checks) {
    const state = c.ok === true ? "pass" : c.ok === false ? "fail" : "skip";
    ul.append(el("li", { class: state, "data-check": c.id, "data-state": state }, el("strong", {}, `${state === "pass" ? "✓" : state === "fail" ? "✗" : "–"} ${c.label}`), el("br"), c.detail));
  }
  box.replaceChildren(verdict, ul);
  box.setAttribute("data-verdict", result.ok ? "pass" : "fail");
}
async function verifyCurrent() {
  const box = $("#detail-checks");
  box.textContent = "Verifying…";
  try {
    const bundle = await api("GET", `/console/api/receipts/${encodeURIComponent(current.receipt_id)}/bundle`);
    renderChecks(box, await verifyBundle(bundle, await jwks()));
  } catch (e) {
    box.textContent = "Could not fetch the bundle: " + e.message;
  }
}
async function readFile(input) {
  const f = input.files && input.files[0];
  return f ? new Uint8Array(await f.arrayBuffer()) : null;
}
async function verifyUpload(ev) {
  ev.preventDefault();
  const box = $("#verify-checks");
  try {
    const bundle = await readFile($("#bundle-file")) ?? $("#bundle-text").value;
    if (bundle.length === 0 || typeof bundle === "string" && !bundle.trim()) throw new Error("give a bundle file or paste one");
    const keys2 = await readFile($("#jwks-file"));
    renderChecks(box, await verifyBundle(bundle, keys2 ?? await jwks()));
  } catch (e) {
    box.replaceChildren(el("p", { class: "verdict fail", "data-verdict": "fail" }, "Not verified: " + e.message));
    box.setAttribute("data-verdict", "fail");
  }
}
async function refreshCheckpoint() {
  const box = $("#ledger-checks");
  try {
    const resp = await fetch("/v1/ledger/checkpoint", { credentials: "omit" });
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    const cp = await resp.json();
    const prove = async (from, to) => {
      const pr = await fetch(`/v1/ledger/proof/consistency?from=${from}&to=${to}`, { credentials: "omit" });
      if (!pr.ok) throw new Error("fetching the consistency proof: HTTP " + pr.status);
      const p = await pr.json();
      return p.proof.map((h) => unhex(h.slice(7)));
    };
    const { checks } = await witness(cp.note, await jwks(), localStorage, prove);
    $("#checkpoint").replaceChildren(...kv([["Number", cp.number], ["Origin", cp.origin], ["Size", cp.size], ["Root", cp.root], ["Verifier key", cp.verifier_key]]).children);
    box.replaceChildren(el("ul", { class: "checks" }, checks.map(([label, ok, detail]) => el("li", { class: ok === true ? "pass" : ok === false ? "fail" : "skip" }, el("strong", {}, label), el("br"), detail))));
  } catch (e) {
    box.replaceChildren(el("p", { class: "verdict fail" }, "Checkpoint not verified: " + e.message));
  }
}
async function loadTokens() {
  if (!session || !session.reads_all) return;
  try {
    const out = await api("GET", "/console/api/tokens");
    const tb = $("#tokens-table tbody");
    tb.replaceChildren(...out.tokens.map((t) => {
      const budgets = Object.keys(t.limits || {}).sort().map((b) => `${b}: ${t.used[b]} / ${t.limits[b]}, ${t.left[b]} left`).join("; ") || "unlimited";
      const expired = t.exp * 1e3 < Date.now();
      const state = t.revoked ? "revoked" : expired ? "expired" : "live";
      const revoke = el("button", { type: "button", class: "danger", "aria-label": `Revoke token ${t.jti} of ${t.agent_id}` }, "Revoke");
      revoke.disabled = t.revoked;
      revoke.hidden = !session.can_revoke;
      revoke.addEventListener("click", () => askRevoke(t.jti));
      return el(
        "tr",
        { "data-jti": t.jti },
        el("td", {}, el("code", {}, t.jti), t.parent ? el("div", {}, "from ", el("code", {}, t.parent)) : "", t.role ? el("div", {}, "role " + t.role) : ""),
        el("td", {}, t.agent_id),
        el("td", {}, new Date(t.exp * 1e3).toLocaleString()),
        el("td", {}, budgets),
        el("td", {}, state),
        el("td", {}, revoke)
      );
    }));
  } catch (e) {
    say("Loading tokens failed: " + e.message, true);
  }
}
var revoking = null;
function askRevoke(jti) {
  revoking = jti;
  $("#revoke-jti").textContent = jti;
  $("#revoke-reason").value = "";
  $("#revoke-dialog").showModal();
  $("#revoke-reason").focus();
}
async function confirmRevoke(ev) {
  ev.preventDefault();
  const reason = $("#revoke-reason").value.trim();
  if (!reason) return;
  $("#revoke-dialog").close();
  try {
    await api("POST", `/console/api/tokens/${encodeURIComponent(revoking)}/revoke`, { reason });
    say(`Token ${revoking} revoked.`);
    loadTokens();
  } catch (e) {
    say("Revoking failed: " + e.message, true);
  }
}
async function login(ev) {
  ev.preventDefault();
  const input = $("#credential");
  const credential = input.value;
  input.value = "";
  try {
    const { key, ...s } = await api("POST", "/console/api/login", { credential });
    sessionStorage.setItem(KEY, key);
    signedIn(s);
    say("Signed in.");
  } catch (e) {
    say("Sign-in failed: " + e.message, true);
    input.focus();
  }
}
async function logout() {
  try {
    await api("POST", "/console/api/logout", {});
  } catch {
  }
  signedOut();
  say("Signed out.");
}
function start() {
  $("#login-form").addEventListener("submit", login);
  $("#logout").addEventListener("click", logout);
  for (const b of document.querySelectorAll("#nav button")) b.addEventListener("click", () => show(b.dataset.view));
  $("#history-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    searchHistory();
  });
  $("#history-more").addEventListener("click", () => searchHistory(true));
  $("#detail-verify").addEventListener("click", verifyCurrent);
  $("#detail-open").addEventListener("click", openCurrent);
  $("#verify-form").addEventListener("submit", verifyUpload);
  $("#ledger-refresh").addEventListener("click", refreshCheckpoint);
  $("#tokens-refresh").addEventListener("click", loadTokens);
  $("#revoke-form").addEventListener("submit", confirmRevoke);
  $("#revoke-cancel").addEventListener("click", () => $("#revoke-dialog").close());
  if (sessionStorage.getItem(KEY)) api("GET", "/console/api/session").then(signedIn, () => signedOut());
  else signedOut();
}
start();
