//! The events every parser of this crate emits (the harmony parser directly, the others
//! through [`ChatParser`](crate::ChatParser)). A file of its own so that the parsers can
//! name it without importing the crate root that assembles them.

/// What a parser decided about a piece of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseEvent {
    /// `reasoning_content` text.
    Reasoning(String),
    /// `content` text.
    Content(String),
    /// A tool call begins: its function name, and the id the model wrote when its format
    /// has one. Its arguments follow as [`ParseEvent::CallArgs`] pieces.
    CallStart {
        /// The function name.
        name: String,
        /// The model's call id, if any.
        id: Option<String>,
    },
    /// A piece of the JSON arguments of the call last started (the pieces of a call
    /// concatenate to its arguments).
    CallArgs(String),
}
