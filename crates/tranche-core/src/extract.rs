//! The answer inside a provider's response body, by endpoint: the text, tool-call arguments,
//! refusal, vector or moderation a request asked for, and why the model stopped (a truncated
//! answer is flagged, so that it is never taken as valid).
//!
//! Shapes (OpenAI's OpenAPI description; Anthropic's Messages API):
//! - chat completions: `choices[0].message` (`content`, `refusal`, `tool_calls[].function`,
//!   the older `function_call`), `choices[0].finish_reason` (`stop`, `length`, `tool_calls`,
//!   `content_filter`, `function_call`);
//! - completions: `choices[0].text`, `choices[0].finish_reason`;
//! - Responses: `output[]` items of type `message` (content parts `output_text`, `refusal`) and
//!   `function_call` (`name`, `arguments`); `status` `incomplete` with
//!   `incomplete_details.reason` (`max_output_tokens`, `content_filter`);
//! - embeddings: `data[0].embedding` (numbers, or base64 text when asked for);
//! - moderations: `results`;
//! - Anthropic messages: `content[]` blocks of type `text` and `tool_use` (`name`, `input`),
//!   `stop_reason` (`end_turn`, `stop_sequence`, `max_tokens`, `tool_use`, `pause_turn`,
//!   `refusal`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Endpoint;

/// Why the model stopped, in tranche's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// A natural end or a stop sequence.
    Complete,
    /// Cut off at the token limit: the answer is incomplete and never valid against a schema.
    Truncated,
    /// The model called tools and waits for their results.
    ToolUse,
    /// The model refused.
    Refused,
    /// Content was withheld by a filter.
    Filtered,
    /// A reason tranche does not know, or none was given (embeddings, moderations).
    Other,
}

/// One tool or function call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text: OpenAI's as the model wrote them (they may not parse),
    /// Anthropic's `input` object serialized.
    pub arguments: String,
}

/// What a response answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "value")]
pub enum Answer {
    /// Text: chat content, completion text, Responses output text, Anthropic text blocks
    /// (several parts joined without a separator).
    Text(String),
    /// Tool or function calls, in order.
    ToolCalls(Vec<ToolCall>),
    /// The model's refusal.
    Refusal(String),
    /// An embedding: numbers, or base64 text.
    Embedding(Value),
    /// Moderation results.
    Moderation(Value),
    /// Nothing: no content, no call.
    Empty,
}

/// An answer and why the model stopped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Extracted {
    pub answer: Answer,
    pub finish: Finish,
    /// The provider's own word for why it stopped, when it gave one.
    pub finish_reason: Option<String>,
}

impl Extracted {
    /// The JSON text a schema is checked against: the text answer, or the arguments of the
    /// one tool call; `None` for anything else (several calls, a refusal, a vector, nothing).
    pub fn json_text(&self) -> Option<&str> {
        match &self.answer {
            Answer::Text(text) => Some(text),
            Answer::ToolCalls(calls) if calls.len() == 1 => Some(&calls[0].arguments),
            _ => None,
        }
    }

    /// Whether the answer was cut off at the token limit.
    pub fn is_truncated(&self) -> bool {
        self.finish == Finish::Truncated
    }
}

/// A response body that does not have the shape its endpoint's responses have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {endpoint} response {problem}")]
pub struct ExtractError {
    pub endpoint: &'static str,
    /// What is wrong, naming the JSON path.
    pub problem: String,
}

/// The answer in `body`, a response of `endpoint`.
pub fn extract(endpoint: Endpoint, body: &str) -> Result<Extracted, ExtractError> {
    if endpoint == Endpoint::ChatCompletions
        && let Some(extracted) = plain_chat(body)
    {
        return Ok(extracted);
    }
    extract_tree(endpoint, body)
}

/// [`extract`] from a tree of the whole body: every shape, with errors that name what is
/// missing.
fn extract_tree(endpoint: Endpoint, body: &str) -> Result<Extracted, ExtractError> {
    let fail = |problem: String| ExtractError { endpoint: endpoint.as_str(), problem };
    let body: Value = serde_json::from_str(body).map_err(|e| fail(format!("is not JSON: {e}")))?;
    match endpoint {
        Endpoint::ChatCompletions => chat(&body).map_err(fail),
        Endpoint::Completions => completion(&body).map_err(fail),
        Endpoint::Responses => responses(&body).map_err(fail),
        Endpoint::Embeddings => {
            let vector = body
                .pointer("/data/0/embedding")
                .ok_or_else(|| fail("has no `data[0].embedding`".to_owned()))?;
            Ok(plain(Answer::Embedding(vector.clone())))
        }
        Endpoint::Moderations => {
            let results = body.get("results").ok_or_else(|| fail("has no `results`".to_owned()))?;
            Ok(plain(Answer::Moderation(results.clone())))
        }
        Endpoint::AnthropicMessages => anthropic(&body).map_err(fail),
    }
}

/// A chat completion whose answer is plain text or a refusal (nearly all of them), read without
/// building a tree of the whole body: the fields needed are borrowed, the rest skipped. `None`
/// for anything else (tool calls, content parts, a body of another shape), which the general
/// reading handles and explains.
fn plain_chat(body: &str) -> Option<Extracted> {
    use std::borrow::Cow;

    use serde::de::IgnoredAny;

    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(borrow)]
        choices: Vec<Choice<'a>>,
    }
    #[derive(Deserialize)]
    struct Choice<'a> {
        #[serde(borrow)]
        message: Message<'a>,
        #[serde(borrow, default)]
        finish_reason: Option<Cow<'a, str>>,
    }
    #[derive(Deserialize)]
    struct Message<'a> {
        #[serde(borrow, default)]
        content: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        refusal: Option<Cow<'a, str>>,
        #[serde(default)]
        tool_calls: Option<IgnoredAny>,
        #[serde(default)]
        function_call: Option<IgnoredAny>,
    }
    let body: Body<'_> = serde_json::from_str(body).ok()?;
    let choice = body.choices.into_iter().next()?;
    let message = choice.message;
    if message.tool_calls.is_some() || message.function_call.is_some() {
        return None;
    }
    let reason = choice.finish_reason.map(Cow::into_owned);
    let (answer, finish) = match (message.refusal, message.content) {
        (Some(refusal), _) => (Answer::Refusal(refusal.into_owned()), Finish::Refused),
        (None, Some(text)) => (Answer::Text(text.into_owned()), openai_finish(reason.as_deref())),
        (None, None) => (Answer::Empty, openai_finish(reason.as_deref())),
    };
    Some(Extracted { answer, finish, finish_reason: reason })
}

fn plain(answer: Answer) -> Extracted {
    Extracted { answer, finish: Finish::Other, finish_reason: None }
}

fn text_at<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn openai_finish(reason: Option<&str>) -> Finish {
    match reason {
        Some("stop") => Finish::Complete,
        Some("length") => Finish::Truncated,
        Some("tool_calls" | "function_call") => Finish::ToolUse,
        Some("content_filter") => Finish::Filtered,
        _ => Finish::Other,
    }
}

fn chat(body: &Value) -> Result<Extracted, String> {
    let choice = body.pointer("/choices/0").ok_or("has no `choices[0]`")?;
    let message = choice.get("message").ok_or("has no `choices[0].message`")?;
    let reason = text_at(choice, "finish_reason");
    let mut calls = Vec::new();
    for (i, call) in
        message.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        let function = call
            .get("function")
            .ok_or_else(|| format!("has no `choices[0].message.tool_calls[{i}].function`"))?;
        calls.push(function_call(
            function,
            &format!("choices[0].message.tool_calls[{i}].function"),
        )?);
    }
    if let Some(function) = message.get("function_call").filter(|f| !f.is_null()) {
        calls.push(function_call(function, "choices[0].message.function_call")?);
    }
    let answer = if let Some(refusal) = text_at(message, "refusal") {
        Answer::Refusal(refusal.to_owned())
    } else if !calls.is_empty() {
        Answer::ToolCalls(calls)
    } else {
        match message.get("content") {
            Some(Value::String(text)) => Answer::Text(text.clone()),
            // Content given as parts: the text parts, joined.
            Some(Value::Array(parts)) => {
                Answer::Text(parts.iter().filter_map(|p| text_at(p, "text")).collect::<String>())
            }
            _ => Answer::Empty,
        }
    };
    let finish = match answer {
        Answer::Refusal(_) => Finish::Refused,
        _ => openai_finish(reason),
    };
    Ok(Extracted { answer, finish, finish_reason: reason.map(str::to_owned) })
}

fn function_call(function: &Value, path: &str) -> Result<ToolCall, String> {
    let name = text_at(function, "name").ok_or_else(|| format!("has no `{path}.name`"))?;
    let arguments = match function.get("arguments") {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => return Err(format!("has no `{path}.arguments`")),
    };
    Ok(ToolCall { name: name.to_owned(), arguments })
}

fn completion(body: &Value) -> Result<Extracted, String> {
    let choice = body.pointer("/choices/0").ok_or("has no `choices[0]`")?;
    let text = text_at(choice, "text").ok_or("has no `choices[0].text`")?;
    let reason = text_at(choice, "finish_reason");
    Ok(Extracted {
        answer: Answer::Text(text.to_owned()),
        finish: openai_finish(reason),
        finish_reason: reason.map(str::to_owned),
    })
}

fn responses(body: &Value) -> Result<Extracted, String> {
    let output = body.get("output").and_then(Value::as_array).ok_or("has no `output` array")?;
    let (mut text, mut refusal, mut calls) = (None::<String>, None::<String>, Vec::new());
    for (i, item) in output.iter().enumerate() {
        match text_at(item, "type") {
            Some("message") => {
                for part in item.get("content").and_then(Value::as_array).into_iter().flatten() {
                    match text_at(part, "type") {
                        Some("output_text") => {
                            text.get_or_insert_default()
                                .push_str(text_at(part, "text").unwrap_or(""));
                        }
                        Some("refusal") => {
                            refusal
                                .get_or_insert_default()
                                .push_str(text_at(part, "refusal").unwrap_or(""));
                        }
                        _ => {}
                    }
                }
            }
            Some("function_call") => calls.push(function_call(item, &format!("output[{i}]"))?),
            _ => {}
        }
    }
    let incomplete = (text_at(body, "status") == Some("incomplete"))
        .then(|| body.pointer("/incomplete_details/reason").and_then(Value::as_str))
        .flatten();
    let (answer, finish) = if let Some(refusal) = refusal {
        (Answer::Refusal(refusal), Finish::Refused)
    } else if !calls.is_empty() {
        (Answer::ToolCalls(calls), Finish::ToolUse)
    } else {
        (text.map_or(Answer::Empty, Answer::Text), Finish::Complete)
    };
    let finish = match incomplete {
        Some("max_output_tokens") => Finish::Truncated,
        Some("content_filter") => Finish::Filtered,
        Some(_) => Finish::Other,
        None => finish,
    };
    let reason = incomplete.or_else(|| text_at(body, "status"));
    Ok(Extracted { answer, finish, finish_reason: reason.map(str::to_owned) })
}

fn anthropic(body: &Value) -> Result<Extracted, String> {
    let blocks = body.get("content").and_then(Value::as_array).ok_or("has no `content` array")?;
    let (mut text, mut calls) = (None::<String>, Vec::new());
    for (i, block) in blocks.iter().enumerate() {
        match text_at(block, "type") {
            Some("text") => {
                text.get_or_insert_default().push_str(text_at(block, "text").unwrap_or(""));
            }
            Some("tool_use") => {
                let name =
                    text_at(block, "name").ok_or_else(|| format!("has no `content[{i}].name`"))?;
                let input =
                    block.get("input").ok_or_else(|| format!("has no `content[{i}].input`"))?;
                calls.push(ToolCall { name: name.to_owned(), arguments: input.to_string() });
            }
            _ => {}
        }
    }
    let reason = text_at(body, "stop_reason");
    let finish = match reason {
        Some("end_turn" | "stop_sequence") => Finish::Complete,
        Some("max_tokens") => Finish::Truncated,
        Some("tool_use") => Finish::ToolUse,
        Some("refusal") => Finish::Refused,
        _ => Finish::Other,
    };
    let answer = if !calls.is_empty() {
        Answer::ToolCalls(calls)
    } else if finish == Finish::Refused {
        Answer::Refusal(text.unwrap_or_default())
    } else {
        text.map_or(Answer::Empty, Answer::Text)
    };
    Ok(Extracted { answer, finish, finish_reason: reason.map(str::to_owned) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_chat_answers_are_read_as_the_whole_tree_reads_them() {
        use serde_json::json;

        let bodies = [
            json!({"choices": [{"message": {"role": "assistant", "content": "hi \"there\""},
                                "finish_reason": "stop"}], "usage": {"prompt_tokens": 3}}),
            json!({"choices": [{"message": {"content": "cut"}, "finish_reason": "length"}]}),
            json!({"choices": [{"message": {"content": null, "refusal": "no"}, "finish_reason": "stop"}]}),
            json!({"choices": [{"message": {"content": null}}]}),
        ];
        for body in bodies {
            let text = body.to_string();
            let tree = extract_tree(Endpoint::ChatCompletions, &text).unwrap();
            assert_eq!(plain_chat(&text), Some(tree), "{text}");
        }
        // Tool calls, content parts and other shapes are left to the tree.
        for body in [
            json!({"choices": [{"message": {"content": null, "tool_calls": []}}]}),
            json!({"choices": [{"message": {"content": [{"type": "text", "text": "a"}]}}]}),
            json!({"choices": []}),
        ] {
            assert_eq!(plain_chat(&body.to_string()), None, "{body}");
        }
    }

    fn text(answer: &str) -> Answer {
        Answer::Text(answer.to_owned())
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall { name: name.to_owned(), arguments: arguments.to_owned() }
    }

    #[test]
    fn chat_content_tool_calls_refusals_and_truncation() {
        let got = extract(
            Endpoint::ChatCompletions,
            r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"{\"a\":1}","refusal":null},"finish_reason":"stop"}]}"#,
        )
        .unwrap();
        assert_eq!((got.answer.clone(), got.finish), (text("{\"a\":1}"), Finish::Complete));
        assert_eq!(got.json_text(), Some("{\"a\":1}"));
        let cut = extract(
            Endpoint::ChatCompletions,
            r#"{"choices":[{"message":{"content":"{\"a\":"},"finish_reason":"length"}]}"#,
        )
        .unwrap();
        assert!(cut.is_truncated());
        assert_eq!(cut.finish_reason.as_deref(), Some("length"));
        let tools = extract(
            Endpoint::ChatCompletions,
            r#"{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"id\": 7}"}}]},"finish_reason":"tool_calls"}]}"#,
        )
        .unwrap();
        assert_eq!(tools.answer, Answer::ToolCalls(vec![call("get", "{\"id\": 7}")]));
        assert_eq!((tools.finish, tools.json_text()), (Finish::ToolUse, Some("{\"id\": 7}")));
        let legacy = extract(
            Endpoint::ChatCompletions,
            r#"{"choices":[{"message":{"content":null,"function_call":{"name":"f","arguments":"{}"}},"finish_reason":"function_call"}]}"#,
        )
        .unwrap();
        assert_eq!(legacy.answer, Answer::ToolCalls(vec![call("f", "{}")]));
        let refused = extract(
            Endpoint::ChatCompletions,
            r#"{"choices":[{"message":{"content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}"#,
        )
        .unwrap();
        assert_eq!(refused.answer, Answer::Refusal("I can't help with that.".into()));
        assert_eq!((refused.finish, refused.json_text()), (Finish::Refused, None));
        let filtered = extract(
            Endpoint::ChatCompletions,
            r#"{"choices":[{"message":{"content":null},"finish_reason":"content_filter"}]}"#,
        )
        .unwrap();
        assert_eq!((filtered.answer, filtered.finish), (Answer::Empty, Finish::Filtered));
    }

    #[test]
    fn responses_output_text_function_calls_and_incomplete_answers() {
        let got = extract(
            Endpoint::Responses,
            r#"{"status":"completed","output":[{"type":"reasoning","summary":[]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]},{"type":"output_text","text":" there"}]}]}"#,
        )
        .unwrap();
        assert_eq!((got.answer, got.finish), (text("Hello there"), Finish::Complete));
        let call_out = extract(
            Endpoint::Responses,
            r#"{"status":"completed","output":[{"type":"function_call","call_id":"c","name":"lookup","arguments":"{\"q\":\"x\"}"}]}"#,
        )
        .unwrap();
        assert_eq!(call_out.answer, Answer::ToolCalls(vec![call("lookup", "{\"q\":\"x\"}")]));
        let cut = extract(
            Endpoint::Responses,
            r#"{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","content":[{"type":"output_text","text":"{\"a\""}]}]}"#,
        )
        .unwrap();
        assert!(cut.is_truncated());
        assert_eq!(cut.finish_reason.as_deref(), Some("max_output_tokens"));
        let refused = extract(
            Endpoint::Responses,
            r#"{"status":"completed","output":[{"type":"message","content":[{"type":"refusal","refusal":"No."}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            (refused.answer, refused.finish),
            (Answer::Refusal("No.".into()), Finish::Refused)
        );
    }

    #[test]
    fn completions_embeddings_and_moderations() {
        let got = extract(
            Endpoint::Completions,
            r#"{"choices":[{"text":"4","index":0,"finish_reason":"length"}]}"#,
        )
        .unwrap();
        assert_eq!((got.answer, got.finish), (text("4"), Finish::Truncated));
        let vector = extract(
            Endpoint::Embeddings,
            r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.25,-1.5]}]}"#,
        )
        .unwrap();
        assert_eq!(vector.answer, Answer::Embedding(serde_json::json!([0.25, -1.5])));
        assert_eq!(vector.json_text(), None);
        let moderation =
            extract(Endpoint::Moderations, r#"{"id":"m","results":[{"flagged":false}]}"#).unwrap();
        assert_eq!(moderation.answer, Answer::Moderation(serde_json::json!([{"flagged": false}])));
    }

    #[test]
    fn anthropic_text_blocks_tool_use_and_max_tokens() {
        let got = extract(
            Endpoint::AnthropicMessages,
            r#"{"type":"message","content":[{"type":"text","text":"Hello"},{"type":"text","text":" again!"}],"stop_reason":"end_turn","usage":{"input_tokens":11,"output_tokens":36}}"#,
        )
        .unwrap();
        assert_eq!((got.answer, got.finish), (text("Hello again!"), Finish::Complete));
        let tool = extract(
            Endpoint::AnthropicMessages,
            r#"{"content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"t","name":"get_weather","input":{"city":"Oslo"}}],"stop_reason":"tool_use"}"#,
        )
        .unwrap();
        assert_eq!(tool.answer, Answer::ToolCalls(vec![call("get_weather", r#"{"city":"Oslo"}"#)]));
        assert_eq!(tool.json_text(), Some(r#"{"city":"Oslo"}"#));
        let cut = extract(
            Endpoint::AnthropicMessages,
            r#"{"content":[{"type":"text","text":"{\"a\": "}],"stop_reason":"max_tokens"}"#,
        )
        .unwrap();
        assert!(cut.is_truncated());
        let refused =
            extract(Endpoint::AnthropicMessages, r#"{"content":[],"stop_reason":"refusal"}"#)
                .unwrap();
        assert_eq!(
            (refused.answer, refused.finish),
            (Answer::Refusal(String::new()), Finish::Refused)
        );
    }

    #[test]
    fn unexpected_shapes_name_the_path() {
        let err = extract(Endpoint::ChatCompletions, r#"{"choices":[]}"#).unwrap_err();
        assert_eq!(err.to_string(), "the /v1/chat/completions response has no `choices[0]`");
        let err = extract(
            Endpoint::ChatCompletions,
            r#"{"choices":[{"message":{"tool_calls":[{"function":{"arguments":"{}"}}]}}]}"#,
        )
        .unwrap_err();
        assert!(err.problem.contains("tool_calls[0].function.name"), "{err}");
        let err = extract(Endpoint::Embeddings, "[1, 2").unwrap_err();
        assert!(err.problem.starts_with("is not JSON"), "{err}");
        let err = extract(Endpoint::AnthropicMessages, r#"{"content":"hi"}"#).unwrap_err();
        assert!(err.problem.contains("`content` array"), "{err}");
    }
}
