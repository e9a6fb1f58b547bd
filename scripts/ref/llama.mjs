// llama.mjs: the reference-side driver of llama.cpp (through node-llama-cpp's prebuilt CPU
// libraries) for the Go package internal/llamaref.
//
// Protocol: one JSON request per line on stdin ({id, op, ...}); one JSON response per line on
// file descriptor 3 ({id, ok, error?, ...}). Stdout is not used for the protocol, so anything the
// native code or node-llama-cpp prints cannot corrupt it; all logs go to stderr. Requests are
// served one at a time, in order. Models are loaded once per path and kept until exit.
//
// Ops: hello; tokenize {model, texts, addSpecial, parseSpecial}; detokenize {model, ids,
// removeSpecial, unparseSpecial}; piece {model, ids, special}; info {model}; eval {model, tokens,
// positions, mode: "logprobs"|"logits", k, ids, threads, kvType, flashAttention, batch}; greedy
// {model, prompt, n, threads, kvType, flashAttention, batch}; bench_prefill {model, tokens, threads,
// batch, reps, kvType, flashAttention}; bench_decode {model, contexts, next, threads, batch, kvType,
// flashAttention}; bench_decode_start {model, contexts, total, threads, batch, kvType,
// flashAttention}; bench_decode_more {model, next}; rss; unload {model}. See internal/llamaref for
// semantics.
//
// node-llama-cpp is found in $CB_REF_DIR/node_modules (default ~/.cache/cacheblend/ref), imported
// through an absolute file URL because ES modules ignore NODE_PATH.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import {pathToFileURL} from "node:url";

const refDir = process.env.CB_REF_DIR || path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache"), "cacheblend", "ref");

// Keep stdout clean even if a library calls console.log.
console.log = console.info = console.debug = (...a) => console.error(...a);

const out = fs.createWriteStream(null, {fd: 3, autoClose: false});
function send(obj) {
    const line = JSON.stringify(obj) + "\n";
    if (!out.write(line))
        return new Promise((resolve) => out.once("drain", resolve));
    return undefined;
}

const nlc = await import(pathToFileURL(path.join(refDir, "node_modules", "node-llama-cpp", "dist", "index.js")).href);
const llama = await nlc.getLlama({
    gpu: false,
    build: "never",
    logLevel: "error",
    logger: (level, message) => {
        if (process.env.CB_REF_VERBOSE || level === "fatal" || level === "error")
            process.stderr.write(`llama.cpp[${level}]: ${message}${message.endsWith("\n") ? "" : "\n"}`);
    },
});

// llama_token_attr bits (include/llama.h).
const ATTR_UNKNOWN = 1 << 0, ATTR_NORMAL = 1 << 2, ATTR_CONTROL = 1 << 3, ATTR_USER_DEFINED = 1 << 4, ATTR_BYTE = 1 << 5;
// enum llama_vocab_type.
const VOCAB = {NONE: 0, SPM: 1, BPE: 2, WPM: 3, UGM: 4, RWKV: 5, PLAMO2: 6};
const VOCAB_NAME = ["none", "spm", "bpe", "wpm", "ugm", "rwkv", "plamo2"];

// readGgufScalars reads a GGUF file's metadata: scalar values as numbers/bigints/strings/booleans,
// arrays as {length}. It reads only the metadata section, a chunk at a time (node-llama-cpp's own
// reader decodes every array, which costs seconds for large vocabularies).
function readGgufScalars(file) {
    const fd = fs.openSync(file, "r");
    try {
        const size = fs.fstatSync(fd).size;
        let buf = Buffer.alloc(0), base = 0, pos = 0;
        const need = (n) => {
            if (pos + n > size) throw new Error(`${file}: truncated GGUF metadata`);
            if (pos + n <= base + buf.length) return;
            const len = Math.max(n, 1 << 20);
            const b = Buffer.alloc(Math.min(len, size - pos));
            fs.readSync(fd, b, 0, b.length, pos);
            buf = b;
            base = pos;
        };
        const u32 = () => { need(4); const v = buf.readUInt32LE(pos - base); pos += 4; return v; };
        const u64 = () => { need(8); const v = buf.readBigUInt64LE(pos - base); pos += 8; return v; };
        const str = () => {
            const n = Number(u64());
            if (n > 1 << 30) throw new Error(`${file}: bad string length`);
            need(n);
            const v = buf.toString("utf8", pos - base, pos - base + n);
            pos += n;
            return v;
        };
        const fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8};
        const scalar = (t) => {
            if (t === 8) return str();
            const n = fixed[t];
            if (n === undefined) throw new Error(`${file}: bad GGUF value type ${t}`);
            need(n);
            const o = pos - base;
            pos += n;
            switch (t) {
                case 0: return buf.readUInt8(o);
                case 1: return buf.readInt8(o);
                case 2: return buf.readUInt16LE(o);
                case 3: return buf.readInt16LE(o);
                case 4: return buf.readUInt32LE(o);
                case 5: return buf.readInt32LE(o);
                case 6: return buf.readFloatLE(o);
                case 7: return buf.readUInt8(o) !== 0;
                case 10: return buf.readBigUInt64LE(o);
                case 11: return buf.readBigInt64LE(o);
                case 12: return buf.readDoubleLE(o);
            }
        };
        const skipArray = (depth) => {
            const t = u32();
            const n = Number(u64());
            if (t === 9) {
                if (depth > 2) throw new Error(`${file}: GGUF arrays nested too deep`);
                for (let i = 0; i < n; i++) skipArray(depth + 1);
            } else if (t === 8) {
                for (let i = 0; i < n; i++) { const l = Number(u64()); pos += l; }
            } else if (fixed[t] !== undefined) pos += n * fixed[t];
            else throw new Error(`${file}: bad GGUF array type ${t}`);
            return n;
        };
        need(4);
        if (buf.toString("latin1", 0, 4) !== "GGUF") throw new Error(`${file}: not a GGUF file`);
        pos = 4;
        const version = u32();
        if (version < 2) throw new Error(`${file}: GGUF version ${version} not supported`);
        u64(); // tensor count
        const nkv = Number(u64());
        const meta = {};
        for (let i = 0; i < nkv; i++) {
            const key = str();
            const t = u32();
            meta[key] = t === 9 ? {length: skipArray(1)} : scalar(t);
        }
        return meta;
    } finally {
        fs.closeSync(fd);
    }
}

class ModelEntry {
    constructor(file) {
        this.file = file;
        this.vocabModel = null; // loadAddonModel(file, vocabOnly=true)
        this.fullModel = null; // loadAddonModel(file, vocabOnly=false)
        this.ctx = null; // the evaluation context (evalContext)
        this.meta = null; // readGgufScalars(file)
        this._vocabInfo = null;
    }

    // any returns a loaded model (the full one if present) for vocabulary work.
    async any() {
        if (this.fullModel) return this.fullModel;
        if (!this.vocabModel) this.vocabModel = await loadAddonModel(this.file, true);
        return this.vocabModel;
    }

    async full() {
        if (!this.fullModel) {
            this.fullModel = await loadAddonModel(this.file, false);
            this.ctx = null;
        }
        return this.fullModel;
    }

    async vocab() {
        if (this._vocabInfo) return this._vocabInfo;
        const a = (await this.any())._model;
        const meta = (this.meta ??= readGgufScalars(this.file));
        const nVocab = meta["tokenizer.ggml.tokens"]?.length ?? 0;
        const type = a.getVocabularyType();
        // A BOS/EOS/SEP id as llama.cpp resolved it. The addon only reports control tokens; fall
        // back to the GGUF key when the id is set but not marked as a control token.
        const ctl = (v, key) => (v >= 0 ? v : typeof meta["tokenizer.ggml." + key] === "number" ? meta["tokenizer.ggml." + key] : -1);
        const pre = typeof meta["tokenizer.ggml.pre"] === "string" ? meta["tokenizer.ggml.pre"] : "";
        const tmodel = typeof meta["tokenizer.ggml.model"] === "string" ? meta["tokenizer.ggml.model"] : "";
        this._vocabInfo = {
            nVocab,
            type,
            addBos: a.shouldPrependBosToken(),
            addEos: a.shouldAppendEosToken(),
            bos: ctl(a.tokenBos(), "bos_token_id"),
            eos: ctl(a.tokenEos(), "eos_token_id"),
            eot: a.eotToken(),
            sep: ctl(a.sepToken(), "seperator_token_id"),
            nl: a.tokenNl(),
            pre,
            tmodel,
            // llama_vocab::impl::escape_whitespaces for BPE vocabularies (src/llama-vocab.cpp).
            bpeEscapesWhitespace: tmodel === "gemma4" || ["gemma4", "granite-embed-multi-311m", "sarvam-moe"].includes(pre),
        };
        return this._vocabInfo;
    }
}

// loadAddonModel loads a model through node-llama-cpp's addon directly (as LlamaModel does,
// without its JavaScript-side metadata reading and checks), on the CPU.
async function loadAddonModel(file, vocabOnly) {
    const b = llama._bindings;
    const a = new b.AddonModel(file, {addonExports: b, gpuLayers: 0, vocabOnly, useMmap: true, checkTensors: false});
    if (!(await a.init())) throw new Error(`llama.cpp failed to load ${file}`);
    return {
        _model: a,
        vocabOnly,
        trainContextSize: a.getTrainContextSize(),
        embeddingVectorSize: a.getEmbeddingVectorSize(),
    };
}

const models = new Map();
function entry(file) {
    if (typeof file !== "string" || file === "") throw new Error("model path missing");
    const abs = path.resolve(file);
    if (!fs.existsSync(abs)) throw new Error(`model file not found: ${abs}`);
    let e = models.get(abs);
    if (!e) {
        e = new ModelEntry(abs);
        models.set(abs, e);
    }
    return e;
}

function checkIds(ids, nVocab, what) {
    if (!Array.isArray(ids)) throw new Error(`${what}: ids must be an array`);
    for (const t of ids)
        if (!Number.isInteger(t) || t < 0 || t >= nVocab) throw new Error(`${what}: token id ${t} out of range [0, ${nVocab})`);
}

// tokenize reproduces llama_tokenize(vocab, text, add_special, parse_special). The addon's
// tokenize is common_tokenize(vocab, text, add_special=false, parse_special); the text is split
// identically whatever add_special is (llama_vocab::impl::tokenize), so add_special only adds the
// tokens llama.cpp adds around the text, per vocabulary type.
function tokenizeOne(m, v, text, addSpecial, parseSpecial) {
    const ids = Array.from(m._model.tokenize(text, parseSpecial));
    if (!addSpecial) return ids;
    switch (v.type) {
        case VOCAB.SPM:
        case VOCAB.UGM:
        case VOCAB.BPE:
            if (v.addBos) {
                if (v.bos < 0) throw new Error("tokenize: vocabulary adds BOS but has no BOS token");
                ids.unshift(v.bos);
            }
            if (v.addEos) {
                if (v.eos < 0) throw new Error("tokenize: vocabulary adds EOS but has no EOS token");
                ids.push(v.eos);
            }
            return ids;
        case VOCAB.WPM:
            if (v.bos < 0 || v.sep < 0) throw new Error("tokenize: WPM vocabulary lacks BOS/SEP");
            return [v.bos, ...ids, v.sep];
        default: // RWKV, PLaMo-2: llama.cpp adds nothing.
            return ids;
    }
}

// detokenize reproduces llama_detokenize(vocab, ids, remove_special, unparse_special) as a JS
// string (llama.cpp's bytes decoded as UTF-8, invalid sequences replaced by U+FFFD). The addon
// always passes remove_special=false; remove_special's effect is rebuilt exactly: a leading BOS
// (if the vocabulary adds BOS) is rendered and then cut off, which keeps llama.cpp's rule that a
// removed BOS disables the leading-space strip; a trailing EOS (if it adds EOS) is dropped.
function detokenizeOne(m, v, ids, removeSpecial, unparseSpecial) {
    let toks = ids.slice();
    let bosPrefix = false;
    if (removeSpecial && v.addBos && toks.length > 0 && toks[0] === v.bos) bosPrefix = true;
    if (removeSpecial && v.addEos && toks.length > (bosPrefix ? 1 : 0) && toks[toks.length - 1] === v.eos) toks.pop();
    const full = m._model.detokenize(Uint32Array.from(toks), unparseSpecial);
    if (!bosPrefix) return full;
    const head = m._model.detokenize(Uint32Array.from([v.bos]), unparseSpecial);
    if (!full.startsWith(head)) throw new Error("detokenize: cannot remove BOS text (clean-up pass crossed it)");
    return full.slice(head.length);
}

// GPT-2 byte-level decoding table (unicode_byte_to_utf8_map in src/unicode.cpp), inverted.
const cpToByte = (() => {
    const map = new Map();
    const direct = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    let n = 0;
    for (let b = 0; b < 256; b++) {
        if (direct(b)) map.set(b, b);
        else map.set(256 + n++, b);
    }
    return map;
})();

const utf8 = new TextEncoder();
const utf8dec = new TextDecoder("utf-8", {fatal: false, ignoreBOM: true}); // keep a leading U+FEFF, as V8 does

// pieceBytes reproduces llama_token_to_piece(vocab, id, buf, n, lstrip=0, special) from the
// token's text, attributes and the vocabulary type (llama_vocab::impl::token_to_piece); the
// addon has no token_to_piece and its strings cannot carry partial UTF-8. Every result is
// checked against llama_detokenize of the single token, so a wrong port cannot go unnoticed.
function pieceBytes(m, v, id, special) {
    const a = m._model;
    const attr = a.getTokenAttributes(id);
    if (!special && attr & (ATTR_UNKNOWN | ATTR_CONTROL)) return new Uint8Array(0);
    const text = a.getTokenString(id) ?? "";
    const hexByte = () => {
        const b = parseInt(text.substring(3, 5), 16);
        return Uint8Array.of(Number.isNaN(b) ? 0 : b);
    };
    const unescape = () => utf8.encode(text.replaceAll("\u2581", " "));
    switch (v.type) {
        case VOCAB.WPM:
        case VOCAB.SPM:
        case VOCAB.UGM:
            if (attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) return utf8.encode(text);
            if (attr & ATTR_NORMAL) return unescape();
            if (attr & ATTR_BYTE) return hexByte();
            return new Uint8Array(0);
        case VOCAB.BPE:
            if (attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) return utf8.encode(text);
            if (attr & ATTR_NORMAL) {
                if (v.bpeEscapesWhitespace) return unescape();
                const outb = [];
                for (const ch of text) {
                    const b = cpToByte.get(ch.codePointAt(0));
                    if (b === undefined) {
                        // llama_decode_text's fallback for a code point outside the byte map.
                        const cp = utf8.encode(ch);
                        outb.push(...utf8.encode("[UNK_BYTE_0x" + Array.from(cp, (x) => x.toString(16).padStart(2, "0")).join("") + text + "]"));
                    } else outb.push(b);
                }
                return Uint8Array.from(outb);
            }
            if (attr & ATTR_BYTE) return hexByte();
            return new Uint8Array(0);
        case VOCAB.PLAMO2:
            if (attr & ATTR_BYTE && text.length === 6 && text.startsWith("<0x") && text.endsWith(">") && /^[0-9a-fA-F]{2}$/.test(text.substring(3, 5)))
                return hexByte();
            return utf8.encode(text);
        default:
            throw new Error(`piece: vocabulary type ${VOCAB_NAME[v.type] ?? v.type} is not supported`);
    }
}

function pieceChecked(m, v, id, special) {
    const b = pieceBytes(m, v, id, special);
    const det = m._model.detokenize(Uint32Array.of(id), special);
    const s = utf8dec.decode(b);
    // llama_detokenize strips one leading space of the first piece when the vocabulary adds a
    // space prefix, and may run its clean-up pass (which never touches a lone leading char).
    if (s === det || (b.length > 0 && b[0] === 0x20 && utf8dec.decode(b.subarray(1)) === det) || cleanSpaces(s) === det || (s.startsWith(" ") && cleanSpaces(s.slice(1)) === det))
        return b;
    throw new Error(`token ${id}: ported token_to_piece gives ${JSON.stringify(s)} but llama_detokenize gives ${JSON.stringify(det)}`);
}

// cleanSpaces ports the clean_spaces passes of llama_vocab::impl::detokenize (ASCII only).
function cleanSpaces(s) {
    let t = s.split("");
    const pass = (fn) => {
        const r = t.length ? [t[0]] : [];
        for (let i = 1; i < t.length; i++) i = fn(r, i);
        t = r;
    };
    pass((r, i) => {
        const x = t[i];
        if (t[i - 1] === " " && (x === "?" || x === "!" || x === "." || x === ",")) r.pop();
        r.push(x);
        return i;
    });
    pass((r, i) => {
        const x = t[i];
        if (x === "'" && i + 1 < t.length && t[i - 1] === " " && t[i + 1] === " ") {
            r.pop();
            r.push(x);
            t[i + 1] = "\0";
            return i + 1;
        }
        r.push(x);
        return i;
    });
    pass((r, i) => {
        const x = t[i];
        if (t[i - 1] === " " && x === "'" && i + 1 < t.length) {
            const x1 = t[i + 1];
            if (x1 === "s" || x1 === "m") r.pop();
            else if (x1 !== "t" && x1 !== "d" && i + 2 < t.length && ((x1 === "r" && t[i + 2] === "e") || (x1 === "v" && t[i + 2] === "e"))) r.pop();
        }
        r.push(x);
        return i;
    });
    return t.join("");
}

function b64(u8) {
    return Buffer.from(u8.buffer, u8.byteOffset, u8.byteLength).toString("base64");
}

// GGML type ids (ggml.h) for the KV cache.
const GGML_TYPE = {f32: 0, f16: 1, bf16: 30, q8_0: 8};

// evalContext returns a context of the model able to hold need tokens with a batch of batch
// tokens, with an empty KV cache. One context is kept per model and reused while its shape fits.
async function evalContext(e, m, need, batch, opts) {
    if (need > m.trainContextSize) throw new Error(`${need} tokens exceed the model's context length ${m.trainContextSize}`);
    const ctxSize = Math.max(256, Math.ceil(need / 256) * 256);
    // an explicit batch size is used as given; the default (whole sequence) is rounded up so
    // that contexts are reused across similar lengths
    const batchSize = opts.batch > 0 ? opts.batch : Math.max(32, Math.ceil(batch / 32) * 32);
    const threads = opts.threads > 0 ? opts.threads : 1;
    const kv = opts.kvType || "f32";
    if (!(kv in GGML_TYPE)) throw new Error(`unknown kv cache type ${JSON.stringify(kv)}`);
    const fa = !!opts.flashAttention;
    const key = `${ctxSize}/${batchSize}/${threads}/${kv}/${fa}`;
    let c = e.ctx;
    if (!c || c.key !== key) {
        if (c) {
            await c.sampler.dispose();
            await c.ctx.dispose();
            e.ctx = null;
        }
        const b = llama._bindings;
        const ctx = new b.AddonContext(m._model, {
            contextSize: ctxSize,
            batchSize,
            sequences: 1,
            flashAttention: fa,
            threads,
            performanceTracking: false,
            kvCacheKeyType: GGML_TYPE[kv],
            kvCacheValueType: GGML_TYPE[kv],
            swaFullCache: true,
        });
        if (!(await ctx.init())) throw new Error("failed to create llama context");
        const sampler = new b.AddonSampler(m._model);
        sampler.applyConfig({}); // plain greedy (argmax of the raw logits), no penalties
        c = e.ctx = {key, ctx, sampler, ctxSize, batchSize};
    }
    c.ctx.disposeSequence(0); // llama_memory_seq_rm(seq 0, all positions)
    return c;
}

function checkTokens(tokens, nVocab, what) {
    checkIds(tokens, nVocab, what);
    if (tokens.length === 0) throw new Error(`${what}: no tokens`);
}

// decodeAll evaluates tokens (positions 0..n-1 of sequence 0) and returns the batch logit index of
// every position in want (sorted, unique), chunked by the batch size.
async function decodeChunks(c, tokens, want, onChunk) {
    let w = 0;
    for (let start = 0; start < tokens.length; start += c.batchSize) {
        const end = Math.min(tokens.length, start + c.batchSize);
        const idx = [];
        while (w < want.length && want[w] < end) idx.push(want[w++] - start);
        c.ctx.initBatch(end - start);
        const li = c.ctx.addToBatch(0, start, Uint32Array.from(tokens.slice(start, end)), Uint32Array.from(idx));
        await c.ctx.decodeBatch();
        await onChunk(Array.from(idx, (p, k) => [p + start, li[k]]));
    }
}

// A sampler per temperature, reused: temperature t, then dist (which leaves the logits alone).
async function tempSampler(e, m, t) {
    e.tempSamplers ??= new Map();
    let s = e.tempSamplers.get(t);
    if (!s) {
        s = new llama._bindings.AddonSampler(m._model);
        s.applyConfig({temperature: t, seed: 1});
        e.tempSamplers.set(t, s);
    }
    return s;
}

// shiftedLogits returns l_i - max_j l_j (float64) for one evaluated position, from llama.cpp's
// float32 softmax: log(p_i / p_max) = l_i - max (error ~2e-7 while p_i is a normal float). Entries
// whose probability is below 1e-30 are recovered at temperature T = 2, 4, ...: there
// log(p_i / p_max) = (l_i - max) / T. Logits still out of reach at T = 4096 are -Infinity.
// probeT (tests only) computes every entry at that temperature, to check the recovery path.
async function shiftedLogits(e, m, c, batchIndex, nVocab, probeT) {
    const out = new Float64Array(nVocab).fill(NaN);
    if (probeT > 1) {
        const [, pt] = await c.ctx.sampleToken(batchIndex, await tempSampler(e, m, probeT), true);
        for (let k = 0; k < pt.length; k += 2) out[pt[k]] = pt[k + 1] > 0 ? probeT * Math.log(pt[k + 1] / pt[1]) : -Infinity;
        return out;
    }
    const [, probs] = await c.ctx.sampleToken(batchIndex, c.sampler, true);
    if (!probs || probs.length !== 2 * nVocab) throw new Error(`expected ${nVocab} probabilities, got ${probs ? probs.length / 2 : 0}`);
    const pmax = probs[1];
    let missing = 0;
    for (let k = 0; k < probs.length; k += 2) {
        const id = probs[k], p = probs[k + 1];
        if (p >= 1e-30) out[id] = Math.log(p / pmax);
        else missing++;
    }
    for (let t = 2; missing > 0 && t <= 4096; t *= 2) {
        const s = await tempSampler(e, m, t);
        const [, pt] = await c.ctx.sampleToken(batchIndex, s, true);
        const ptmax = pt[1];
        missing = 0;
        for (let k = 0; k < pt.length; k += 2) {
            const id = pt[k], p = pt[k + 1];
            if (!Number.isNaN(out[id])) continue;
            if (p >= 1e-30) out[id] = t * Math.log(p / ptmax);
            else missing++;
        }
    }
    for (let i = 0; i < nVocab; i++) if (Number.isNaN(out[i])) out[i] = -Infinity;
    return out;
}

function logSumExp(x) {
    let mx = -Infinity;
    for (const v of x) if (v > mx) mx = v;
    if (mx === -Infinity) return -Infinity;
    let s = 0;
    for (const v of x) s += Math.exp(v - mx);
    return mx + Math.log(s);
}

function evalOpts(req) {
    return {threads: req.threads | 0, kvType: req.kvType || "f32", flashAttention: !!req.flashAttention, batch: req.batch | 0};
}

// benchContext returns a fresh context for the benchmark ops (cb bench --vs-llamacpp): ctxSize
// cells, a batch (and micro-batch) of batchSize tokens, seqs sequences. The evaluation context of
// the model is dropped first, so one context at a time holds memory.
async function benchContext(e, m, ctxSize, batchSize, seqs, opts) {
    if (e.ctx) {
        await e.ctx.sampler.dispose();
        await e.ctx.ctx.dispose();
        e.ctx = null;
    }
    if (e.bench && e.bench.key !== `${ctxSize}/${batchSize}/${seqs}/${opts.threads}/${opts.kvType}/${opts.flashAttention}`) {
        await e.bench.ctx.dispose();
        e.bench = null;
    }
    if (!e.bench) {
        const kv = opts.kvType || "f16";
        if (!(kv in GGML_TYPE)) throw new Error(`unknown kv cache type ${JSON.stringify(kv)}`);
        const ctx = new llama._bindings.AddonContext(m._model, {
            contextSize: ctxSize,
            batchSize,
            sequences: seqs,
            flashAttention: opts.flashAttention === "auto" ? "auto" : !!opts.flashAttention,
            threads: opts.threads > 0 ? opts.threads : 1,
            performanceTracking: false,
            kvCacheKeyType: GGML_TYPE[kv],
            kvCacheValueType: GGML_TYPE[kv],
        });
        if (!(await ctx.init())) throw new Error("failed to create llama context");
        e.bench = {key: `${ctxSize}/${batchSize}/${seqs}/${opts.threads}/${opts.kvType}/${opts.flashAttention}`, ctx};
    }
    for (let s = 0; s < seqs; s++) e.bench.ctx.disposeSequence(s);
    e.bench.decode = null; // bench_decode_more's sequences are gone
    return e.bench.ctx;
}

// benchFill evaluates tokens at positions [start, start+n) of sequence seq in chunks of batchSize,
// logits for the last token only (what a prompt's prefill computes).
async function benchFill(ctx, seq, start, tokens, batchSize) {
    for (let off = 0; off < tokens.length; off += batchSize) {
        const end = Math.min(tokens.length, off + batchSize);
        ctx.initBatch(end - off);
        ctx.addToBatch(seq, start + off, Uint32Array.from(tokens.slice(off, end)), end === tokens.length ? Uint32Array.of(end - off - 1) : new Uint32Array(0));
        await ctx.decodeBatch();
    }
}

// checkSteps validates decode steps: one in-vocabulary token per sequence each.
function checkSteps(next, seqs, nVocab) {
    if (!Array.isArray(next)) throw new Error("bench_decode: next is not a list of steps");
    for (const n of next) {
        if (!Array.isArray(n) || n.length !== seqs) throw new Error("bench_decode: a step needs one token per sequence");
        checkIds(n, nVocab, "bench_decode next");
    }
}

const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

function benchOpts(req) {
    return {threads: req.threads | 0, kvType: req.kvType || "f16", flashAttention: req.flashAttention ?? "auto"};
}

const ops = {

    // eval: evaluate tokens and return, for every asked position, either the full shifted logits
    // (mode "logits": float64 l_i - max, base64) or the top-k log-probabilities plus the
    // log-probabilities of the asked ids (mode "logprobs").
    async eval(req) {
        const e = entry(req.model);
        const m = await e.full();
        const v = await e.vocab();
        const tokens = req.tokens;
        checkTokens(tokens, v.nVocab, "eval");
        const positions = req.positions;
        if (!Array.isArray(positions) || positions.length === 0) throw new Error("eval: no positions");
        for (const p of positions)
            if (!Number.isInteger(p) || p < 0 || p >= tokens.length) throw new Error(`eval: position ${p} out of range [0, ${tokens.length})`);
        const want = [...new Set(positions)].sort((a, b) => a - b);
        const k = Math.max(0, Math.min(req.k | 0, v.nVocab));
        const ids = Array.isArray(req.ids) ? req.ids : [];
        checkIds(ids, v.nVocab, "eval ids");
        const c = await evalContext(e, m, tokens.length, tokens.length, evalOpts(req));
        const rows = new Map();
        await decodeChunks(c, tokens, want, async (pairs) => {
            for (const [pos, bi] of pairs) {
                const sl = await shiftedLogits(e, m, c, bi, v.nVocab, req.probeTemperature | 0);
                if (req.mode === "logits") {
                    rows.set(pos, Buffer.from(sl.buffer).toString("base64"));
                    continue;
                }
                const lse = logSumExp(sl);
                const order = Array.from({length: v.nVocab}, (_, i) => i);
                // top-k by log-probability, ties by lower id
                order.sort((a, b) => sl[b] - sl[a] || a - b);
                rows.set(pos, {
                    top: order.slice(0, k).map((id) => [id, sl[id] - lse]),
                    ids: ids.map((id) => sl[id] - lse),
                });
            }
        });
        return {rows: positions.map((p) => rows.get(p))};
    },

    // greedy: evaluate the prompt, then n times take the argmax of the logits (llama.cpp's greedy
    // sampler: the first maximum, i.e. the lowest id on ties) and feed it back. It never stops
    // early, end-of-generation tokens included.
    async greedy(req) {
        const e = entry(req.model);
        const m = await e.full();
        const v = await e.vocab();
        const prompt = req.prompt;
        checkTokens(prompt, v.nVocab, "greedy");
        const n = req.n | 0;
        if (n < 0 || n > 1 << 20) throw new Error(`greedy: bad n ${req.n}`);
        const c = await evalContext(e, m, prompt.length + n, prompt.length, evalOpts(req));
        const outIds = [];
        let bi = -1;
        await decodeChunks(c, prompt, [prompt.length - 1], async (pairs) => {
            for (const [, b] of pairs) bi = b;
        });
        for (let i = 0; i < n; i++) {
            const tok = await c.ctx.sampleToken(bi, c.sampler);
            if (tok < 0) throw new Error("greedy: sampling failed");
            outIds.push(tok);
            if (i === n - 1) break;
            c.ctx.initBatch(1);
            bi = c.ctx.addToBatch(0, prompt.length + i, Uint32Array.of(tok), Uint32Array.of(0))[0];
            await c.ctx.decodeBatch();
        }
        return {tokens: outIds};
    },
    // bench_prefill: time the prefill of tokens (sequence 0 from an empty cache) reps times, in
    // chunks of batch tokens (llama.cpp's default micro-batch is 512). Returns milliseconds per rep.
    async bench_prefill(req) {
        const e = entry(req.model);
        const m = await e.full();
        const v = await e.vocab();
        checkTokens(req.tokens, v.nVocab, "bench_prefill");
        const batch = req.batch > 0 ? req.batch | 0 : 512;
        const reps = Math.max(1, req.reps | 0);
        const ctxSize = Math.ceil(req.tokens.length / 256) * 256;
        const ctx = await benchContext(e, m, ctxSize, batch, 1, benchOpts(req));
        const ms = [];
        for (let r = 0; r < reps; r++) {
            ctx.disposeSequence(0);
            const t0 = nowMs();
            await benchFill(ctx, 0, 0, req.tokens, batch);
            ms.push(nowMs() - t0);
        }
        return {ms};
    },

    // bench_decode: prefill one context per sequence (req.contexts, untimed), then req.next.length
    // decode steps, each feeding every sequence its next token (req.next[step][seq]) in one batch —
    // the sequences share each step's pass over the weights. Returns milliseconds per step.
    async bench_decode(req) {
        const v = await entry(req.model).vocab();
        checkSteps(req.next, req.contexts.length, v.nVocab); // before the prefill
        await ops.bench_decode_start({...req, total: req.next.length});
        return ops.bench_decode_more(req);
    },

    // bench_decode_start: bench_decode's untimed part: a context for the sequences req.contexts
    // with room for req.total more steps, each sequence's context prefilled. The context stays,
    // for bench_decode_more, until the model's next benchmark op or unload.
    async bench_decode_start(req) {
        const e = entry(req.model);
        const m = await e.full();
        const v = await e.vocab();
        const seqs = req.contexts.length;
        if (seqs < 1 || seqs > 64) throw new Error(`bench_decode: ${seqs} sequences`);
        const total = req.total | 0;
        if (total < 1 || total > 1 << 20) throw new Error(`bench_decode: ${req.total} steps`);
        let need = 0;
        for (const c of req.contexts) {
            checkTokens(c, v.nVocab, "bench_decode context");
            need = Math.max(need, c.length + total);
        }
        const batch = req.batch > 0 ? req.batch | 0 : 512;
        const ctxSize = Math.ceil((need * seqs) / 256) * 256;
        const ctx = await benchContext(e, m, ctxSize, Math.max(batch, seqs), seqs, benchOpts(req));
        for (let s = 0; s < seqs; s++) await benchFill(ctx, s, 0, req.contexts[s], batch);
        e.bench.decode = {pos: req.contexts.map((c) => c.length), left: total, nVocab: v.nVocab};
        return {};
    },

    // bench_decode_more: req.next.length more steps of the sequences bench_decode_start set up,
    // at the positions after the steps before. Returns milliseconds per step.
    async bench_decode_more(req) {
        const e = entry(req.model);
        const d = e.bench?.decode;
        if (!d) throw new Error("bench_decode_more: no context of bench_decode_start for this model");
        const seqs = d.pos.length;
        const steps = req.next.length;
        if (steps < 1 || steps > d.left) throw new Error(`bench_decode_more: ${steps} steps with room for ${d.left}`);
        checkSteps(req.next, seqs, d.nVocab);
        const ctx = e.bench.ctx;
        const ms = [];
        for (let i = 0; i < steps; i++) {
            const t0 = nowMs();
            ctx.initBatch(seqs);
            for (let s = 0; s < seqs; s++) ctx.addToBatch(s, d.pos[s] + i, Uint32Array.of(req.next[i][s]), Uint32Array.of(0));
            await ctx.decodeBatch();
            ms.push(nowMs() - t0);
        }
        for (let s = 0; s < seqs; s++) d.pos[s] += steps;
        d.left -= steps;
        return {ms};
    },

    // rss: the driver process's resident memory in bytes.
    async rss() {
        return {rss: process.memoryUsage.rss()};
    },

    // unload: drop a model and its contexts.
    async unload(req) {
        const abs = path.resolve(String(req.model));
        const e = models.get(abs);
        if (!e) return {};
        models.delete(abs);
        if (e.bench) await e.bench.ctx.dispose();
        if (e.ctx) {
            await e.ctx.sampler.dispose();
            await e.ctx.ctx.dispose();
        }
        for (const s of e.tempSamplers?.values() ?? []) await s.dispose();
        if (e.fullModel) await e.fullModel._model.dispose();
        if (e.vocabModel) await e.vocabModel._model.dispose();
        return {};
    },

    async hello() {
        return {pid: process.pid, node: process.version, refDir, llamaCppRelease: llama.llamaCppRelease};
    },

    async tokenize(req) {
        const e = entry(req.model);
        const m = await e.any();
        const v = await e.vocab();
        if (!Array.isArray(req.texts)) throw new Error("tokenize: texts must be an array");
        return {tokens: req.texts.map((t) => tokenizeOne(m, v, String(t), !!req.addSpecial, !!req.parseSpecial))};
    },

    async detokenize(req) {
        const e = entry(req.model);
        const m = await e.any();
        const v = await e.vocab();
        checkIds(req.ids, v.nVocab, "detokenize");
        return {text: detokenizeOne(m, v, req.ids, !!req.removeSpecial, !!req.unparseSpecial)};
    },

    async piece(req) {
        const e = entry(req.model);
        const m = await e.any();
        const v = await e.vocab();
        checkIds(req.ids, v.nVocab, "piece");
        return {pieces: req.ids.map((id) => b64(pieceChecked(m, v, id, !!req.special)))};
    },

    async info(req) {
        const e = entry(req.model);
        const m = await e.any();
        const v = await e.vocab();
        const a = m._model;
        const meta = e.meta;
        const str = (k) => (typeof meta[k] === "string" ? meta[k] : "");
        const arch = str("general.architecture");
        const info = {
            file: e.file,
            vocab_type: VOCAB_NAME[v.type] ?? String(v.type),
            n_vocab: v.nVocab,
            bos: v.bos,
            eos: v.eos,
            eot: v.eot,
            sep: v.sep,
            nl: v.nl,
            add_bos: v.addBos,
            add_eos: v.addEos,
            tokenizer_model: v.tmodel,
            tokenizer_pre: v.pre,
            architecture: arch,
            name: str("general.name"),
            vocab_only: m.vocabOnly,
            n_ctx_train: m.trainContextSize,
            n_embd: m.embeddingVectorSize,
        };
        if (!m.vocabOnly) {
            info.n_params = a.getTotalParameters();
            info.size = a.getModelSize();
            info.description = a.getModelDescription();
        }
        const eog = [];
        for (let i = 0; i < v.nVocab; i++) if (a.isEogToken(i)) eog.push(i);
        info.eog = eog;
        return info;
    },
};

async function handle(line) {
    let req;
    try {
        req = JSON.parse(line);
    } catch (err) {
        return send({id: -1, ok: false, error: `bad request line: ${err.message}`});
    }
    const fn = Object.hasOwn(ops, req.op) ? ops[req.op] : undefined;
    if (!fn) return send({id: req.id, ok: false, error: `unknown op ${JSON.stringify(req.op)}`});
    try {
        const res = await fn(req);
        return send({id: req.id, ok: true, ...res});
    } catch (err) {
        return send({id: req.id, ok: false, error: String(err?.message ?? err)});
    }
}

let chain = Promise.resolve();
const rl = readline.createInterface({input: process.stdin, crlfDelay: Infinity});
rl.on("line", (line) => {
    if (line.trim() === "") return;
    chain = chain.then(() => handle(line));
});
rl.on("close", () => {
    chain.then(async () => {
        out.end();
        await llama.dispose().catch(() => {});
        process.exit(0);
    });
});
await send({id: 0, ok: true, ready: true, pid: process.pid});
