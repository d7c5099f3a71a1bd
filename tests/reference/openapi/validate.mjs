// Validates an OpenAPI document with @seriousme/openapi-schema-validator, run unmodified:
// against the OpenAPI Initiative's JSON Schema for the document's version, then resolving
// every $ref. Prints one JSON line; exit 0 = valid, 1 = invalid, 2 = usage.
import { Validator } from "@seriousme/openapi-schema-validator";

const path = process.argv[2];
if (!path) {
  console.error("usage: node validate.mjs OPENAPI.json");
  process.exit(2);
}
const validator = new Validator();
const res = await validator.validate(path);
let refsResolved = false;
if (res.valid) {
  try {
    validator.resolveRefs();
    refsResolved = true;
  } catch (e) {
    res.valid = false;
    res.errors = [{ message: "unresolvable $ref: " + e.message }];
  }
}
console.log(JSON.stringify({ valid: res.valid, version: validator.version, refsResolved, errors: res.errors ?? [] }));
process.exit(res.valid ? 0 : 1);
