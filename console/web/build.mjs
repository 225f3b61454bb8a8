// Builds the console's embedded assets: src/app.js (with its npm
// dependencies) bundled by esbuild into OUT/app.js, and index.html and
// style.css copied. OUT is the first argument (default ../assets).
// The output depends only on the sources and the pinned versions, so
// `make console-check` can rebuild into a temporary dir and compare.
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";

const here = new URL(".", import.meta.url).pathname;
const out = process.argv[2] || join(here, "../assets");
mkdirSync(out, { recursive: true });
await build({
  entryPoints: [join(here, "src/app.js")],
  bundle: true,
  format: "esm",
  target: "chrome120",
  charset: "utf8",
  legalComments: "inline",
  outfile: join(out, "app.js"),
  logLevel: "warning",
});
for (const f of ["index.html", "style.css"]) copyFileSync(join(here, f), join(out, f));
