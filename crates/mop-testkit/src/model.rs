//! A scripted stand-in for a model provider's API (Anthropic's Messages API, OpenAI's
//! Responses API) on loopback, so the real agent CLIs run whole turns offline: the CLI is
//! real, only the model's answers are prepared. The script decides each answer from the
//! request, so a turn that calls tools goes on as the CLI sends their results back.

use std::process::Output;

use serde_json::Value;

use crate::procs::output_text as text;

/// A stand-in for a model provider's API on loopback: it records every request and answers
/// with a canned script, so the real agent CLIs run their whole turn offline. It is the
/// model that is faked here, never mop or the CLI: whatever the CLI sends is what the
/// CLI itself loaded.
pub struct Recorder {
    /// Its port on 127.0.0.1.
    pub port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

/// How the recorder answers one POST: `(content type, body)`, from the request's path and
/// body.
pub type Script = fn(&str, &str) -> (String, String);

impl Recorder {
    /// Listens on a free loopback port and answers every POST with `script`.
    pub fn start(script: Script) -> Recorder {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut stream = stream;
                    loop {
                        let mut request_line = String::new();
                        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                            return;
                        }
                        let mut length = 0usize;
                        let mut chunked = false;
                        loop {
                            let mut h = String::new();
                            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                                return;
                            }
                            let h = h.trim_end();
                            if h.is_empty() {
                                break;
                            }
                            let lower = h.to_ascii_lowercase();
                            if let Some(v) = lower.strip_prefix("content-length:") {
                                length = v.trim().parse().unwrap_or(0);
                            }
                            if lower.starts_with("transfer-encoding:") && lower.contains("chunked")
                            {
                                chunked = true;
                            }
                        }
                        let mut body = Vec::new();
                        if chunked {
                            loop {
                                let mut size = String::new();
                                reader.read_line(&mut size).unwrap();
                                let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                                let mut chunk = vec![0; n + 2];
                                reader.read_exact(&mut chunk).unwrap();
                                if n == 0 {
                                    break;
                                }
                                body.extend_from_slice(&chunk[..n]);
                            }
                        } else {
                            body.resize(length, 0);
                            reader.read_exact(&mut body).unwrap();
                        }
                        let mut parts = request_line.split_whitespace();
                        let method = parts.next().unwrap_or("").to_owned();
                        let path = parts.next().unwrap_or("").to_owned();
                        let body = String::from_utf8_lossy(&body).into_owned();
                        let (ctype, answer) = if method == "POST" {
                            script(&path, &body)
                        } else {
                            ("application/json".into(), "{}".into())
                        };
                        log.lock().unwrap().push((format!("{method} {path}"), body));
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: keep-alive\r\n\r\n",
                            answer.len()
                        );
                        let sent = stream.write_all(head.as_bytes()).and_then(|_| {
                            if method == "HEAD" {
                                Ok(())
                            } else {
                                stream.write_all(answer.as_bytes())
                            }
                        });
                        if sent.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Recorder { port, seen }
    }

    /// Every request so far: its line and body.
    pub fn requests(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }

    /// After an agent's turn (`what`) that must have succeeded: the bodies of the requests
    /// whose line starts with `prefix` (`POST /v1/…`), in order.
    pub fn posts_after(&self, turn: &Output, what: &str, prefix: &str) -> Vec<String> {
        eprintln!("{what}: {}", text(turn));
        let requests = self.requests();
        eprintln!(
            "requests to the stand-in model: {:?}",
            requests
                .iter()
                .map(|(r, b)| (r, b.len()))
                .collect::<Vec<_>>()
        );
        assert!(turn.status.success(), "{}", text(turn));
        requests
            .into_iter()
            .filter(|(r, _)| r.starts_with(prefix))
            .map(|(_, b)| b)
            .collect()
    }
}

/// Server-sent events, one per JSON event, named by its `type`.
pub fn sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect()
}

/// One tool call a script makes: the call's id, the tool's name and its input.
pub type ToolCall = (String, String, Value);

/// An Anthropic Messages API answer to `request` (streamed when it asked for a stream):
/// the tool call, or else the closing text.
pub fn anthropic_answer(
    request: &Value,
    call: Option<ToolCall>,
    closing: &str,
) -> (String, String) {
    let stop = if call.is_some() {
        "tool_use"
    } else {
        "end_turn"
    };
    if request["stream"] != true {
        let content = match &call {
            Some((id, name, input)) => {
                serde_json::json!([{"type":"tool_use","id":id,"name":name,"input":input}])
            }
            None => serde_json::json!([{"type":"text","text":closing}]),
        };
        return (
            "application/json".into(),
            serde_json::json!({"id":"msg_1","type":"message","role":"assistant","model":"recorder","content":content,"stop_reason":stop,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}).to_string(),
        );
    }
    let (block, delta) = match &call {
        Some((id, name, input)) => (
            serde_json::json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":id,"name":name,"input":{}}}),
            serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":input.to_string()}}),
        ),
        None => (
            serde_json::json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
            serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":closing}}),
        ),
    };
    (
        "text/event-stream".into(),
        sse(&[
            serde_json::json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"recorder","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}}),
            block,
            delta,
            serde_json::json!({"type":"content_block_stop","index":0}),
            serde_json::json!({"type":"message_delta","delta":{"stop_reason":stop,"stop_sequence":null},"usage":{"output_tokens":1}}),
            serde_json::json!({"type":"message_stop"}),
        ]),
    )
}

/// The next of `steps` a Claude Code turn has not had the result of (by the tool-use id
/// in `body`), or `None` when all have been answered. An MCP tool Claude Code offers only
/// deferred (by name, through its ToolSearch tool) is loaded first, with a ToolSearch call
/// of its own.
pub fn claude_next(request: &Value, body: &str, steps: &[ToolCall]) -> Option<ToolCall> {
    let answered = |id: &str| body.contains(&format!("\"tool_use_id\":\"{id}\""));
    let offered = |name: &str| {
        request["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == name))
    };
    let (id, name, input) = steps.iter().find(|(id, _, _)| !answered(id))?;
    let search = format!("{id}_search");
    if name.starts_with("mcp__") && !offered(name) && !answered(&search) {
        return Some((
            search,
            "ToolSearch".into(),
            serde_json::json!({"query": format!("select:{name}")}),
        ));
    }
    Some((id.clone(), name.clone(), input.clone()))
}

/// An OpenAI Responses API answer (streamed): `item` as the response's one output item.
pub fn responses_answer(item: Value) -> (String, String) {
    let response = serde_json::json!({"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":1,"input_tokens_details":{"cached_tokens":0},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":2}});
    (
        "text/event-stream".into(),
        sse(&[
            serde_json::json!({"type":"response.created","response":{"id":"resp_1"}}),
            serde_json::json!({"type":"response.output_item.done","output_index":0,"item":item}),
            serde_json::json!({"type":"response.completed","response":response}),
        ]),
    )
}

/// A Responses API closing message.
pub fn responses_text(text: &str) -> Value {
    serde_json::json!({"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":text,"annotations":[]}]})
}

/// A Responses API call of an MCP tool, as Codex names it: `name` in the server's
/// namespace `mcp__<server>`.
pub fn responses_mcp_call(call_id: &str, server: &str, name: &str, arguments: &Value) -> Value {
    serde_json::json!({"type":"function_call","id":format!("fc_{call_id}"),"call_id":call_id,"namespace":format!("mcp__{server}"),"name":name,"arguments":arguments.to_string(),"status":"completed"})
}
