//! Static types of selector expressions: what each identifier, field, index and call
//! yields, so an expression that cannot be a bool is refused when compiled. Part of
//! `model/cel.rs`.

use super::*;

/// What the type check knows of a subexpression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List,
    Map,
    Type,
    Quantity,
    Semver,
    Device,
    /// `device.attributes`: domain → attributes.
    Attributes,
    /// `device.attributes[domain]`: name → value of any type.
    AttributeDomain,
    /// `device.capacity`: domain → capacities.
    Capacities,
    /// `device.capacity[domain]`: name → quantity.
    CapacityDomain,
    /// Unknown until run time.
    Dyn,
}

impl Ty {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Bool => "bool",
            Self::Int => "int",
            Self::Uint => "uint",
            Self::Double => "double",
            Self::String => "string",
            Self::Bytes => "bytes",
            Self::Null => "null_type",
            Self::List => "list",
            Self::Map | Self::Attributes | Self::Capacities => "map",
            Self::AttributeDomain | Self::CapacityDomain => "map",
            Self::Type => "type",
            Self::Quantity => "kubernetes.Quantity",
            Self::Semver => "kubernetes.Semver",
            Self::Device => "kubernetes.dra.Device",
            Self::Dyn => "dyn",
        }
    }

    pub(super) fn is_numeric(self) -> bool {
        matches!(self, Self::Int | Self::Uint | Self::Double)
    }

    /// Whether a value of this type may be used where `want` is expected.
    pub(super) fn fits(self, want: Ty) -> bool {
        self == Ty::Dyn || self == want
    }
}

/// Comprehension variables in scope, innermost last.
pub(super) type Scope = Vec<(String, Ty)>;

pub(super) fn infer(e: &IdedExpr, scope: &Scope, depth: usize) -> Result<Ty, String> {
    if depth > EXPRESSION_DEPTH_MAX {
        return Err(format!(
            "expression nests deeper than {EXPRESSION_DEPTH_MAX} levels"
        ));
    }
    let next = depth + 1;
    match &e.expr {
        Expr::Unspecified => Err("empty expression".to_string()),
        Expr::Literal(literal) => Ok(match literal {
            LiteralValue::Boolean(_) => Ty::Bool,
            LiteralValue::Bytes(_) => Ty::Bytes,
            LiteralValue::Double(_) => Ty::Double,
            LiteralValue::Int(_) => Ty::Int,
            LiteralValue::Null => Ty::Null,
            LiteralValue::String(_) => Ty::String,
            LiteralValue::UInt(_) => Ty::Uint,
        }),
        Expr::Ident(name) => ident_type(name, scope),
        Expr::List(list) => {
            for element in &list.elements {
                infer(element, scope, next)?;
            }
            Ok(Ty::List)
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                if let cel::common::ast::EntryExpr::MapEntry(entry) = &entry.expr {
                    infer(&entry.key, scope, next)?;
                    infer(&entry.value, scope, next)?;
                }
            }
            Ok(Ty::Map)
        }
        Expr::Struct(s) => Err(format!("undeclared type '{}'", s.type_name)),
        Expr::Select(select) => {
            let operand = infer(&select.operand, scope, next)?;
            let field = field_type(operand, &select.field)?;
            Ok(if select.test { Ty::Bool } else { field })
        }
        Expr::Comprehension(c) => {
            infer(&c.iter_range, scope, next)?;
            let accu = infer(&c.accu_init, scope, next)?;
            let mut inner = scope.clone();
            inner.push((c.iter_var.clone(), Ty::Dyn));
            if let Some(second) = &c.iter_var2 {
                inner.push((second.clone(), Ty::Dyn));
            }
            inner.push((c.accu_var.clone(), accu));
            infer(&c.loop_cond, &inner, next)?;
            infer(&c.loop_step, &inner, next)?;
            infer(&c.result, &inner, next)
        }
        Expr::Call(call) => {
            let target = match &call.target {
                Some(t) => Some(infer(t, scope, next)?),
                None => None,
            };
            let mut args = Vec::with_capacity(call.args.len());
            for arg in &call.args {
                args.push(infer(arg, scope, next)?);
            }
            call_type(&call.func_name, target, &args)
        }
    }
}

pub(super) fn ident_type(name: &str, scope: &Scope) -> Result<Ty, String> {
    if let Some((_, ty)) = scope.iter().rev().find(|(n, _)| n == name) {
        return Ok(*ty);
    }
    match name {
        DEVICE_VAR => Ok(Ty::Device),
        "int" | "uint" | "double" | "bool" | "string" | "bytes" | "list" | "map" | "null_type"
        | "type" | "dyn" => Ok(Ty::Type),
        other => Err(format!("undeclared reference to '{other}'")),
    }
}

pub(super) fn field_type(operand: Ty, field: &str) -> Result<Ty, String> {
    match operand {
        Ty::Device => match field {
            "driver" => Ok(Ty::String),
            "attributes" => Ok(Ty::Attributes),
            "capacity" => Ok(Ty::Capacities),
            "allowMultipleAllocations" => Ok(Ty::Bool),
            other => Err(format!("undefined field '{other}' of device")),
        },
        Ty::Attributes => Ok(Ty::AttributeDomain),
        Ty::Capacities => Ok(Ty::CapacityDomain),
        Ty::AttributeDomain | Ty::Map | Ty::Dyn => Ok(Ty::Dyn),
        Ty::CapacityDomain => Ok(Ty::Quantity),
        other => Err(format!("type '{}' has no field '{field}'", other.name())),
    }
}

pub(super) fn index_type(container: Ty, key: Ty) -> Result<Ty, String> {
    let string_key = |out: Ty| {
        if key.fits(Ty::String) {
            Ok(out)
        } else {
            Err(format!("map keys are strings, not {}", key.name()))
        }
    };
    match container {
        Ty::Attributes => string_key(Ty::AttributeDomain),
        Ty::Capacities => string_key(Ty::CapacityDomain),
        Ty::AttributeDomain => string_key(Ty::Dyn),
        Ty::CapacityDomain => string_key(Ty::Quantity),
        Ty::List | Ty::Map | Ty::Dyn => Ok(Ty::Dyn),
        other => Err(format!(
            "found no matching overload for '_[_]' applied to '{}'",
            other.name()
        )),
    }
}

pub(super) fn comparable(a: Ty, b: Ty) -> bool {
    if a == Ty::Dyn || b == Ty::Dyn {
        return true;
    }
    (a.is_numeric() && b.is_numeric()) || (a == b && matches!(a, Ty::String | Ty::Bytes | Ty::Bool))
}

pub(super) fn call_type(name: &str, target: Option<Ty>, args: &[Ty]) -> Result<Ty, String> {
    let no_overload = || {
        let mut types: Vec<&str> = target.iter().map(|t| t.name()).collect();
        types.extend(args.iter().map(|t| t.name()));
        Err(format!(
            "found no matching overload for '{name}' applied to '({})'",
            types.join(", ")
        ))
    };
    let bool_operands = |operands: &[Ty]| {
        if operands.iter().all(|t| t.fits(Ty::Bool)) {
            Ok(Ty::Bool)
        } else {
            no_overload()
        }
    };
    match (name, target, args) {
        (operators::LOGICAL_AND | operators::LOGICAL_OR, None, _) => bool_operands(args),
        (operators::LOGICAL_NOT | operators::NOT_STRICTLY_FALSE, None, _) => bool_operands(args),
        (operators::EQUALS | operators::NOT_EQUALS | operators::IN, None, [_, _]) => Ok(Ty::Bool),
        (
            operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS,
            None,
            [a, b],
        ) => {
            if comparable(*a, *b) {
                Ok(Ty::Bool)
            } else {
                no_overload()
            }
        }
        (
            operators::ADD
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO,
            None,
            [a, b],
        ) => match (a, b) {
            (Ty::Dyn, _) | (_, Ty::Dyn) => Ok(Ty::Dyn),
            (a, b)
                if a == b && (a.is_numeric() || matches!(a, Ty::String | Ty::Bytes | Ty::List)) =>
            {
                Ok(*a)
            }
            _ => no_overload(),
        },
        (operators::NEGATE, None, [a]) if a.is_numeric() || *a == Ty::Dyn => Ok(*a),
        (operators::CONDITIONAL, None, [cond, a, b]) => {
            if !cond.fits(Ty::Bool) {
                return no_overload();
            }
            Ok(if a == b { *a } else { Ty::Dyn })
        }
        (operators::INDEX | operators::OPT_INDEX, None, [container, key]) => {
            index_type(*container, *key)
        }
        (operators::OPT_SELECT, None, _) => Ok(Ty::Dyn),
        // Conversions and global functions.
        ("quantity", None, [a]) if a.fits(Ty::String) => Ok(Ty::Quantity),
        ("semver", None, [a]) if a.fits(Ty::String) => Ok(Ty::Semver),
        ("isQuantity" | "isSemver", None, [a]) if a.fits(Ty::String) => Ok(Ty::Bool),
        ("size", None, [_]) | ("size", Some(_), []) => Ok(Ty::Int),
        ("int", None, [_]) => Ok(Ty::Int),
        ("uint", None, [_]) => Ok(Ty::Uint),
        ("double", None, [_]) => Ok(Ty::Double),
        ("string", None, [_]) => Ok(Ty::String),
        ("bytes", None, [_]) => Ok(Ty::Bytes),
        ("bool", None, [_]) => Ok(Ty::Bool),
        ("type", None, [_]) => Ok(Ty::Type),
        ("dyn", None, [_]) => Ok(Ty::Dyn),
        ("matches", None, [_, _]) => Ok(Ty::Bool),
        // Quantity and semver members.
        ("isGreaterThan" | "isLessThan", Some(t), [a])
            if (t.fits(Ty::Quantity) && a.fits(Ty::Quantity))
                || (t.fits(Ty::Semver) && a.fits(Ty::Semver)) =>
        {
            Ok(Ty::Bool)
        }
        ("compareTo", Some(t), [a])
            if (t.fits(Ty::Quantity) && a.fits(Ty::Quantity))
                || (t.fits(Ty::Semver) && a.fits(Ty::Semver)) =>
        {
            Ok(Ty::Int)
        }
        ("add" | "sub", Some(t), [a])
            if t.fits(Ty::Quantity) && (a.fits(Ty::Quantity) || *a == Ty::Int) =>
        {
            Ok(Ty::Quantity)
        }
        ("sign" | "asInteger", Some(t), []) if t.fits(Ty::Quantity) => Ok(Ty::Int),
        ("isInteger", Some(t), []) if t.fits(Ty::Quantity) => Ok(Ty::Bool),
        ("asApproximateFloat", Some(t), []) if t.fits(Ty::Quantity) => Ok(Ty::Double),
        ("major" | "minor" | "patch", Some(t), []) if t.fits(Ty::Semver) => Ok(Ty::Int),
        // Kubernetes' `includes` (DRAListTypeAttributes): a list attribute holds the
        // value, or a scalar one equals it.
        ("includes", Some(t), [a])
            if matches!(
                t,
                Ty::Dyn | Ty::List | Ty::String | Ty::Int | Ty::Bool | Ty::Semver
            ) && !matches!(a, Ty::List | Ty::Map) =>
        {
            Ok(Ty::Bool)
        }
        // String members (standard library and strings extension).
        ("startsWith" | "endsWith" | "contains" | "matches", Some(t), [_])
            if t.fits(Ty::String) =>
        {
            Ok(Ty::Bool)
        }
        ("lowerAscii" | "upperAscii" | "trim" | "reverse", Some(t), []) if t.fits(Ty::String) => {
            Ok(Ty::String)
        }
        ("charAt" | "substring" | "replace", Some(t), _) if t.fits(Ty::String) => Ok(Ty::String),
        ("indexOf" | "lastIndexOf", Some(t), _) if t.fits(Ty::String) => Ok(Ty::Int),
        ("split", Some(t), _) if t.fits(Ty::String) => Ok(Ty::List),
        ("join", Some(t), _) if t.fits(Ty::List) => Ok(Ty::String),
        _ if is_known_function(name) => no_overload(),
        _ => Err(format!("undeclared reference to '{name}'")),
    }
}

pub(super) fn is_known_function(name: &str) -> bool {
    name.starts_with('_')
        || name.starts_with('@')
        || matches!(
            name,
            "quantity"
                | "semver"
                | "includes"
                | "isQuantity"
                | "isSemver"
                | "size"
                | "int"
                | "uint"
                | "double"
                | "string"
                | "bytes"
                | "bool"
                | "type"
                | "dyn"
                | "matches"
                | "isGreaterThan"
                | "isLessThan"
                | "compareTo"
                | "add"
                | "sub"
                | "sign"
                | "asInteger"
                | "isInteger"
                | "asApproximateFloat"
                | "major"
                | "minor"
                | "patch"
                | "startsWith"
                | "endsWith"
                | "contains"
                | "lowerAscii"
                | "upperAscii"
                | "trim"
                | "reverse"
                | "charAt"
                | "substring"
                | "replace"
                | "indexOf"
                | "lastIndexOf"
                | "split"
                | "join"
                | "-_"
                | "!_"
        )
}
