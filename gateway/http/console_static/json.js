// JSON shown exactly as stored. JSON.parse would round 18446744073709551616 and
// 0.10000000000000000001; here numbers keep their text and objects their key order.

class Num {
  constructor(text) {
    this.text = text;
  }
}

class Obj {
  constructor(pairs) {
    this.pairs = pairs;
  }

  get(key) {
    const pair = this.pairs.find(([k]) => k === key);
    return pair ? pair[1] : undefined;
  }
}

export function parseExact(text) {
  let i = 0;
  const space = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const fail = () => {
    throw new SyntaxError(`unexpected JSON at offset ${i}`);
  };
  const string = () => {
    if (text[i] !== '"') fail();
    let j = i + 1;
    while (j < text.length && text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
    const out = JSON.parse(text.slice(i, j + 1));
    i = j + 1;
    return out;
  };
  const value = () => {
    space();
    const c = text[i];
    if (c === "{") {
      i++;
      const pairs = [];
      space();
      if (text[i] === "}") return i++, new Obj(pairs);
      for (;;) {
        space();
        const key = string();
        space();
        if (text[i++] !== ":") fail();
        pairs.push([key, value()]);
        space();
        if (text[i] === ",") i++;
        else if (text[i++] === "}") return new Obj(pairs);
        else fail();
      }
    }
    if (c === "[") {
      i++;
      const items = [];
      space();
      if (text[i] === "]") return i++, items;
      for (;;) {
        items.push(value());
        space();
        if (text[i] === ",") i++;
        else if (text[i++] === "]") return items;
        else fail();
      }
    }
    if (c === '"') return string();
    for (const [word, val] of [["true", true], ["false", false], ["null", null]]) {
      if (text.startsWith(word, i)) return (i += word.length), val;
    }
    const m = /^-?\d+(\.\d+)?([eE][-+]?\d+)?/.exec(text.slice(i, i + 5000));
    if (!m) fail();
    i += m[0].length;
    return new Num(m[0]);
  };
  const out = value();
  space();
  if (i !== text.length) fail();
  return out;
}

export function pretty(v, indent = "") {
  if (v instanceof Num) return v.text;
  if (v === null) return "null";
  if (typeof v === "string") return JSON.stringify(v);
  if (typeof v === "boolean") return String(v);
  const inner = indent + "  ";
  if (Array.isArray(v)) {
    if (!v.length) return "[]";
    return `[\n${v.map((x) => inner + pretty(x, inner)).join(",\n")}\n${indent}]`;
  }
  if (!v.pairs.length) return "{}";
  const lines = v.pairs.map(([k, x]) => `${inner}${JSON.stringify(k)}: ${pretty(x, inner)}`);
  return `{\n${lines.join(",\n")}\n${indent}}`;
}
