//! The tri-state upsert field.

/// One column of an upsert: left as it is, cleared, or set.
///
/// Mirrors the JavaScript adapter, where an `undefined` key is dropped from the statement
/// (the column keeps its value, or its DEFAULT on insert) and a `null` is written as NULL.
/// `Option<Option<T>>` would say the same but reads badly at call sites.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Field<T> {
    /// Not part of the statement: an existing row keeps its value, a new row gets the default.
    #[default]
    Absent,
    /// Written as SQL NULL.
    Null,
    /// Written as this value.
    Value(T),
}

impl<T> Field<T> {
    /// `Value(v)` for `Some(v)`, `Null` for `None` (a provided, possibly null, value).
    pub fn from_option(value: Option<T>) -> Self {
        match value {
            Some(v) => Field::Value(v),
            None => Field::Null,
        }
    }

    /// Whether the column takes part in the statement.
    pub fn is_present(&self) -> bool {
        !matches!(self, Field::Absent)
    }
}

impl<T> From<T> for Field<T> {
    fn from(value: T) -> Self {
        Field::Value(value)
    }
}
