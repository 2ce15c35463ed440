//! Unit tests of the `mutate` processor.

use super::*;
use crate::common::{build_err, build_yaml, get, loghub, tags};

fn obj(json: &str) -> Event {
    match Value::from_json_slice(json.as_bytes()).unwrap() {
        Value::Object(m) => Event::new(m),
        _ => panic!("not an object"),
    }
}

fn json(e: &Event) -> String {
    e.to_json_string()
}

#[test]
fn rename_moves_and_keeps_order_of_entries() {
    let p = build_yaml("type: mutate\nrename: {/a: /b, /b: /c/d, /missing: /x}");
    let mut e = obj(r#"{"a":1,"z":2}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(json(&e), r#"{"z":2,"c":{"d":1}}"#);
    // Into a scalar's child: the value stays where it was and the event is tagged.
    let p = build_yaml("type: mutate\nrename: {/a: /z/y}");
    let mut e = obj(r#"{"a":1,"z":2}"#);
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(json(&e), r#"{"z":2,"a":1,"tags":["_mutate_error"]}"#);
}

#[test]
fn copy_clones() {
    let p = build_yaml("type: mutate\ncopy: {/a: /b/c, /nope: /x, /a/k: /z/q}");
    let mut e = obj(r#"{"a":{"k":[1]},"z":3}"#);
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(json(&e), r#"{"a":{"k":[1]},"z":3,"b":{"c":{"k":[1]}},"tags":["_mutate_error"]}"#);
}

#[test]
fn add_renders_templates_and_keeps_types() {
    let p = build_yaml(
        "type: mutate\nadd:\n  /n2: '%{/n}'\n  /info/text: 'n=%{/n} host=%{/host}'\n  /const: hello\n  /gone: '%{/nope}'",
    );
    let mut e = obj(r#"{"n":5,"host":"web-1"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(
        json(&e),
        r#"{"n":5,"host":"web-1","n2":5,"info":{"text":"n=5 host=web-1"},"const":"hello","gone":null}"#
    );
}

#[test]
fn remove_paths() {
    let p = build_yaml("type: mutate\nremove: [/a/b, /c, /nothing/here]");
    let mut e = obj(r#"{"a":{"b":1,"k":2},"c":3,"d":4}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(json(&e), r#"{"a":{"k":2},"d":4}"#);
}

#[test]
fn convert_every_type() {
    let p = build_yaml(
        "type: mutate\nconvert: {/i: int, /f: float, /b: boolean, /s: string, /arr: integer, /t: string, /n: int}",
    );
    let mut e = obj(r#"{"i":"-42","f":"2.5","b":"Yes","s":12.0,"arr":["1","2.9",3.1,true],"n":null}"#);
    e.fields.insert("t", Value::Timestamp(0));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(
        json(&e),
        r#"{"i":-42,"f":2.5,"b":true,"s":"12.0","arr":[1,2,3,1],"n":null,"t":"1970-01-01T00:00:00.000Z"}"#
    );
    for (text, want) in [("TRUE", true), ("t", true), ("1", true), ("no", false), ("F", false), ("0", false)] {
        assert_eq!(text_to_bool(text), Some(want), "{text}");
    }
    assert_eq!(text_to_bool("maybe"), None);
    let p = build_yaml("type: mutate\nconvert: {/a: float, /b: int}");
    let mut e = obj(r#"{"a":true,"b":false}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(json(&e), r#"{"a":1.0,"b":0}"#);
    let p = build_yaml("type: mutate\nconvert: {/a: bool, /b: bool}");
    let mut e = obj(r#"{"a":0,"b":1}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(json(&e), r#"{"a":false,"b":true}"#);
}

#[test]
fn failed_conversion_tags_and_continues() {
    let p = build_yaml(
        "type: mutate\nconvert: {/a: int, /b: float, /c: bool, /d: int, /e: int}\nuppercase: [/u]\n\
         tag_on_failure: [conv_failed]",
    );
    let mut e = obj(r#"{"a":"x1","b":"nan","c":"perhaps","d":["1","z"],"e":{"k":1},"u":"up"}"#);
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(
        json(&e),
        r#"{"a":"x1","b":"nan","c":"perhaps","d":[1,"z"],"e":{"k":1},"u":"UP","tags":["conv_failed"]}"#
    );
    let p = build_yaml("type: mutate\nconvert: {/a: bool, /b: int}");
    let mut e = obj(r#"{"a":7,"b":1e300}"#);
    assert_eq!(p.process(&mut e), Verdict::Failed);
}

#[test]
fn case_changes() {
    let p = build_yaml("type: mutate\nlowercase: [/a, /arr, /n]\nuppercase: [/b, /missing]");
    let mut e = obj(r#"{"a":"MiXeD ÄÖ","arr":["X","Ÿ",1],"n":5,"b":"straße"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(json(&e), r#"{"a":"mixed äö","arr":["x","ÿ",1],"n":5,"b":"STRASSE"}"#);
}

#[test]
fn split_strings() {
    let p = build_yaml("type: mutate\nsplit: {/csv: ',', /words: ' ', /arr: ',', /n: ','}");
    let mut e = obj(r#"{"csv":"a,b,,c","words":"one","arr":["x,y"]}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(json(&e), r#"{"csv":["a","b","","c"],"words":["one"],"arr":["x,y"]}"#);
    let mut e = obj(r#"{"n":5}"#);
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(tags(&e), ["_mutate_error"]);
}

#[test]
fn merge_like_logstash() {
    let p = build_yaml("type: mutate\nmerge: {/a: /b, /s: /t, /new: /b, /o: /p, /keep: /missing}");
    let mut e = obj(r#"{"a":[1],"b":[2,3],"s":"x","t":"y","o":{"k":1,"j":1},"p":{"k":2},"keep":4}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(
        json(&e),
        r#"{"a":[1,2,3],"b":[2,3],"s":["x","y"],"t":"y","o":{"k":2,"j":1},"p":{"k":2},"keep":4,"new":[2,3]}"#
    );
    let p = build_yaml("type: mutate\nmerge: {/a: /o, /o: /a}");
    let mut e = obj(r#"{"a":[1],"o":{"k":1}}"#);
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(json(&e), r#"{"a":[1],"o":{"k":1},"tags":["_mutate_error"]}"#);
}

#[test]
fn tags_add_and_remove() {
    let p = build_yaml("type: mutate\nadd_tag: [seen, 'host_%{/host}', '%{/none}']\nremove_tag: [old, seen]");
    let mut e = obj(r#"{"host":"a","tags":["old","keep"]}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(tags(&e), ["keep", "host_a"]);
    let p = build_yaml("type: mutate\nremove_tag: [solo]");
    let mut e = obj(r#"{"tags":"solo"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(json(&e), "{}");
    let mut e = obj(r#"{"tags":"other"}"#);
    p.process(&mut e);
    assert_eq!(json(&e), r#"{"tags":"other"}"#);
}

#[test]
fn operations_run_in_fixed_order() {
    // Written in reverse order; still renamed, copied, converted, cased, split, merged,
    // then (like Logstash's add_field and remove_field) added, removed and tagged.
    let p = build_yaml(
        "type: mutate\nremove_tag: [t1]\nadd_tag: [t1, t2]\nmerge: {/parts: /extra}\nsplit: {/parts: '-'}\n\
         uppercase: [/parts]\nlowercase: [/parts]\nconvert: {/num: int}\nremove: [/tmp]\n\
         add: {/num: '%{/copied}', /extra: z}\ncopy: {/renamed: /copied}\nrename: {/orig: /renamed}",
    );
    let mut e = obj(r#"{"orig":"7","parts":"a-b","tmp":1}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(json(&e), r#"{"parts":["A","B"],"renamed":"7","copied":"7","num":"7","extra":"z","tags":["t2"]}"#);
}

#[test]
fn config_errors() {
    let e = build_err("type: mutate\nrename: {'a//b': /c}");
    assert!(e.contains("rename.a//b: invalid field path `a//b`"), "{e}");
    let e = build_err("type: mutate\nconvert: {/a: number}");
    assert!(e.contains("convert./a: unknown variant `number`"), "{e}");
    let e = build_err("type: mutate\nsplit: {/a: ''}");
    assert!(e.contains("split: the separator for /a is empty"), "{e}");
    let e = build_err("type: mutate\nadd: {/a: '%{/b'}");
    assert!(e.contains("unterminated"), "{e}");
    let e = build_err("type: mutate\nreplace: {/a: b}");
    assert!(e.contains("unknown field `replace`"), "{e}");
    let e = build_err("type: mutate\nremove: /a");
    assert!(e.contains("remove: expected a list"), "{e}");
}

/// Every line of HDFS_2k.log (`081109 203615 148 INFO dfs.DataNode$PacketResponder: ...`):
/// split into words, the pid converted, the level lowercased.
#[test]
fn hdfs_lines() {
    // Three processors, since within one `add` runs after `split`, `convert` and `lowercase`.
    let first = build_yaml("type: mutate\ncopy: {/message: /words}\nsplit: {/words: ' '}");
    let second = build_yaml("type: mutate\nadd: {/pid: '%{/words/2}', /level: '%{/words/3}'}\nremove: [/words]");
    let third = build_yaml("type: mutate\nconvert: {/pid: int}\nlowercase: [/level]");
    let p = Chain(Arc::new(Chain(first, second)), third);
    let text = loghub("HDFS_2k.log");
    for line in text.lines() {
        let mut e = Event::from_message_at(line, 0);
        assert_eq!(p.process(&mut e), Verdict::Keep, "{line}");
        let words: Vec<&str> = line.split(' ').collect();
        assert_eq!(get(&e, "/pid"), Some(&Value::Int(words[2].parse().unwrap())), "{line}");
        assert_eq!(get(&e, "/level").and_then(Value::as_str), Some(words[3].to_lowercase().as_str()));
        assert_eq!(get(&e, "/words"), None);
    }
    let mut e = Event::from_message_at("081109 203615 148 INFO dfs.DataNode$PacketResponder: x", 0);
    p.process(&mut e);
    assert_eq!(get(&e, "/pid"), Some(&Value::Int(148)));
    assert_eq!(get(&e, "/level"), Some(&Value::from("info")));
}

struct Chain(Arc<dyn Processor>, Arc<dyn Processor>);

impl Processor for Chain {
    fn process(&self, event: &mut Event) -> Verdict {
        match self.0.process(event) {
            Verdict::Keep => self.1.process(event),
            other => other,
        }
    }
}
