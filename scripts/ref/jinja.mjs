// Renders Hugging Face chat templates with @huggingface/jinja (the reference the Go package chat is
// compared against). Reads JSON from stdin and writes JSON to stdout.
//
// Input: one case, or {"cases": [case, ...]} to render many in one process. A case is
//   {"template": "...", "messages": [...], "add_generation_prompt": true, "bos_token": "<s>",
//    "eos_token": "</s>", "now": "2024-07-26T10:30:00Z", ...any other template variables}
// Every key except "template" and "now" becomes a template variable. When "now" is set,
// strftime_now is replaced by a formatter for that fixed instant (UTC fields, English month names,
// the same directives @huggingface/jinja's strftime knows: %Y %m %d %b %B %H %M %%).
// Output: {"output": "..."} or {"error": "..."} per case; an array when the input had "cases".
//
// The package is imported by absolute file URL from CB_REF_DIR (default ~/.cache/cacheblend/ref,
// made by scripts/deps.sh) because ES modules ignore NODE_PATH.
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const refDir =
	process.env.CB_REF_DIR || join(process.env.XDG_CACHE_HOME || join(homedir(), ".cache"), "cacheblend", "ref");
const { Template, Environment } = await import(
	pathToFileURL(join(refDir, "node_modules", "@huggingface", "jinja", "dist", "index.js")).href
);

const monthsLong = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const pad2 = (n) => (n < 10 ? "0" + n : String(n));

function fixedStrftime(now) {
	const d = new Date(now);
	if (Number.isNaN(d.getTime())) throw new Error(`bad "now": ${now}`);
	return (format) =>
		String(format).replace(/%[YmdbBHM%]/g, (t) => {
			switch (t) {
				case "%Y": return String(d.getUTCFullYear());
				case "%m": return pad2(d.getUTCMonth() + 1);
				case "%d": return pad2(d.getUTCDate());
				case "%b": return monthsLong[d.getUTCMonth()].slice(0, 3);
				case "%B": return monthsLong[d.getUTCMonth()];
				case "%H": return pad2(d.getUTCHours());
				case "%M": return pad2(d.getUTCMinutes());
				case "%%": return "%";
			}
			return t;
		});
}

// Template.render declares the globals (raise_exception, range, strftime_now, ...) itself and refuses
// to redeclare one, so the fixed-date strftime_now is swapped in where the globals are declared; the
// rest of the rendering path is @huggingface/jinja's own.
let strftimeOverride = null;
const declare = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
	if (name === "strftime_now" && strftimeOverride && this.parent === undefined) value = strftimeOverride;
	return declare.call(this, name, value);
};

const cache = new Map();
function renderCase(c) {
	try {
		const { template, now, ...vars } = c;
		let t = cache.get(template);
		if (!t) {
			t = new Template(template);
			cache.set(template, t);
		}
		strftimeOverride = now !== undefined && now !== null ? fixedStrftime(now) : null;
		return { output: t.render(vars) };
	} catch (e) {
		return { error: String(e && e.message ? e.message : e) };
	}
}

const input = JSON.parse(readFileSync(0, "utf8"));
const result = Array.isArray(input.cases) ? input.cases.map(renderCase) : renderCase(input);
process.stdout.write(JSON.stringify(result));
