//! CEL device selectors in the Kubernetes DRA environment.
//!
//! Owns [`compile_selector`] (parse with the `cel` crate, then a static type check that
//! refuses what Kubernetes' compiler refuses: an expression whose type is known and is
//! not `bool`, undeclared identifiers, functions or device fields), the process-wide
//! cache of compiled selectors (keyed by expression text, bounded by
//! [`COMPILED_SELECTORS_MAX`]; it is no replicated state and changes no result), and
//! [`CompiledSelector::matches`], which evaluates a selector against one device with
//! Kubernetes' shapes: `device.driver`, `device.allowMultipleAllocations`,
//! `device.attributes["domain"].name` (string, int, bool or semver version, or a list of
//! them; an attribute without a domain belongs to its driver's domain) and `device.capacity["domain"].name`
//! (a quantity). As in Kubernetes, an unknown domain reads as an empty map and a missing
//! name is a runtime error (test with `"name" in …` or `has(…)`).
//!
//! The quantity library (`quantity`, `isQuantity`, `isGreaterThan`, `isLessThan`,
//! `compareTo`, `add`, `sub`, `sign`, `isInteger`, `asInteger`, `asApproximateFloat`,
//! `==`) and the semver library (`semver`, `isSemver`, `major`, `minor`, `patch`,
//! `isGreaterThan`, `isLessThan`, `compareTo`, `==`) follow Kubernetes, as does
//! `includes` (a list attribute holds the value, a scalar one equals it): quantities are
//! exact signed nano-units (see [`crate::model::quantity::parse_nano`]) and have no `<`;
//! versions compare by semver precedence. The `cel` crate's strings extension is
//! available too. Invariant: evaluation is pure (no clock, no randomness), so equal
//! devices give equal answers. Called by model validation (classes, claims) and the
//! engine's device allocation.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use cel::common::ast::{operators, Expr, IdedExpr, LiteralValue};
use cel::common::traits::{Container, Indexer, Sizer};
use cel::common::types::{CelBool, CelDouble, CelInt, CelList, CelString, Type, MAP_TYPE};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{Context, DeclarationError, Env, ExecutionError, Program, Value};

use crate::model::device::{AllocationSharing, AttributeValue, Device};
use crate::model::quantity::{parse_nano, NANO_PER_UNIT};
use crate::model::semver::Semver;

/// Longest selector expression, in bytes (Kubernetes' CELSelectorExpressionMaxLength).
pub const SELECTOR_LENGTH_MAX: usize = 10 * 1024;
/// Most compiled selectors kept in the process-wide cache; the cache starts afresh when full.
pub const COMPILED_SELECTORS_MAX: usize = 4096;
/// Deepest expression tree the type check walks, in nodes from the root.
const EXPRESSION_DEPTH_MAX: usize = 256;

/// The name selectors see the device under.
const DEVICE_VAR: &str = "device";

static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");
static SEMVER_TYPE: Type = Type::new_unspecified_type("kubernetes.Semver");
static DEVICE_TYPE: Type = Type::new_unspecified_type("kubernetes.dra.Device");

/// Most device results one compiled selector remembers; it starts afresh when full.
pub const SELECTOR_RESULTS_MAX: usize = 65_536;

/// Results of one selector by driver and device content (a pure function of both).
#[derive(Debug, Default)]
struct Results {
    by_driver: HashMap<String, HashMap<Device, Result<bool, SelectorError>>>,
    len: usize,
}

/// A selector that compiled and type-checked; evaluate it with [`CompiledSelector::matches`].
#[derive(Debug)]
pub struct CompiledSelector {
    source: String,
    program: Program,
    /// Upper bound of one evaluation's cost (see `cel_cost`).
    estimated_cost: u64,
    /// Set while a warmer evaluates this selector ahead of plans.
    warming: std::sync::atomic::AtomicBool,
    /// Results kept by device content: equal devices give equal results, so a hit
    /// changes speed, never an answer.
    results: Mutex<Results>,
}

/// A selector that failed on a device at run time (Kubernetes aborts the allocation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CEL runtime error in \"{expression}\": {message}")]
pub struct SelectorError {
    /// The expression.
    pub expression: String,
    /// What went wrong.
    pub message: String,
}

impl CompiledSelector {
    /// The expression text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Upper bound of one evaluation's cost, in Kubernetes' cost units.
    pub fn estimated_cost(&self) -> u64 {
        self.estimated_cost
    }

    /// Whether the result for `device` of `driver` is known without evaluating.
    pub fn is_cached(&self, driver: &str, device: &Device) -> bool {
        self.results.lock().is_ok_and(|r| {
            r.by_driver
                .get(driver)
                .is_some_and(|m| m.contains_key(device))
        })
    }

    /// Marks the selector as being warmed; false if another warmer already is.
    pub fn start_warming(&self) -> bool {
        !self.warming.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Ends a warming started with [`CompiledSelector::start_warming`].
    pub fn end_warming(&self) {
        self.warming
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Whether `device` of `driver` satisfies the selector; runtime errors (a missing
    /// attribute, a non-bool result) are errors, as in Kubernetes. Results are kept by
    /// device content (at most [`SELECTOR_RESULTS_MAX`]).
    pub fn matches(&self, driver: &str, device: &Device) -> Result<bool, SelectorError> {
        if let Ok(results) = self.results.lock() {
            if let Some(hit) = results.by_driver.get(driver).and_then(|m| m.get(device)) {
                return hit.clone();
            }
        }
        let result = self.evaluate(driver, device);
        if let Ok(mut results) = self.results.lock() {
            if results.len >= SELECTOR_RESULTS_MAX {
                *results = Results::default();
            }
            results.len += 1;
            results
                .by_driver
                .entry(driver.to_string())
                .or_default()
                .insert(device.clone(), result.clone());
        }
        result
    }

    /// Evaluates the selector on one device.
    fn evaluate(&self, driver: &str, device: &Device) -> Result<bool, SelectorError> {
        let mut context = Context::with_env(Arc::clone(environment()));
        context.add_variable_as_val(DEVICE_VAR, Box::new(DeviceVal { driver, device }));
        let fail = |message: String| SelectorError {
            expression: self.source.clone(),
            message,
        };
        match self.program.execute(&context) {
            Ok(Value::Bool(result)) => Ok(result),
            Ok(other) => Err(fail(format!("evaluated to {other:?}, not a bool"))),
            Err(error) => Err(fail(error.to_string())),
        }
    }
}

/// Compiles `expression`, or explains why it cannot be a selector (it does not parse,
/// names something undeclared, or cannot evaluate to bool). Results are cached.
pub fn compile_selector(expression: &str) -> Result<Arc<CompiledSelector>, String> {
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Ok(map) = cache.lock() {
        if let Some(hit) = map.get(expression) {
            return hit.clone();
        }
    }
    let compiled = compile_uncached(expression);
    if let Ok(mut map) = cache.lock() {
        if map.len() >= COMPILED_SELECTORS_MAX {
            map.clear();
        }
        map.insert(expression.to_string(), compiled.clone());
    }
    compiled
}

type CompileResult = Result<Arc<CompiledSelector>, String>;

static CACHE: OnceLock<Mutex<HashMap<String, CompileResult>>> = OnceLock::new();
static ENV: OnceLock<Arc<Env>> = OnceLock::new();

fn environment() -> &'static Arc<Env> {
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // Registration fails only on duplicate names, which would be a bug here;
        // a failed extension leaves its functions undeclared.
        let _ = env.add_extension(cel::extensions::strings);
        let _ = register_kubernetes(&mut env);
        Arc::new(env)
    })
}

fn compile_uncached(expression: &str) -> CompileResult {
    if expression.trim().is_empty() {
        return Err("must not be empty".to_string());
    }
    if expression.len() > SELECTOR_LENGTH_MAX {
        return Err(format!(
            "expression is longer than {SELECTOR_LENGTH_MAX} bytes"
        ));
    }
    check_nesting(expression)?;
    let program = environment()
        .compile(expression)
        .map_err(|e| format!("compilation failed: {}", e.to_string().trim()))?;
    let scope = Vec::new();
    let ty = infer(program.expression(), &scope, 0)?;
    if !matches!(ty, Ty::Bool | Ty::Dyn) {
        return Err(format!(
            "must evaluate to bool or the unknown type, not {}",
            ty.name()
        ));
    }
    let estimated_cost = crate::model::cel_cost::check(program.expression())?;
    Ok(Arc::new(CompiledSelector {
        source: expression.to_string(),
        program,
        estimated_cost,
        warming: std::sync::atomic::AtomicBool::new(false),
        results: Mutex::new(Results::default()),
    }))
}

/// Deepest nesting of brackets, and longest run of prefix operators, a selector may
/// have. The parser recurses once per level, and a hostile expression must be refused
/// before it runs out of stack (Kubernetes' CEL parser also bounds recursion).
pub const SELECTOR_NESTING_MAX: usize = 32;

/// Refuses text that nests brackets or prefix operators deeper than
/// [`SELECTOR_NESTING_MAX`], looking past string literals, before it is parsed.
fn check_nesting(expression: &str) -> Result<(), String> {
    let mut depth = 0usize;
    let mut prefix_run = 0usize;
    let mut chars = expression.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' => {
                // Skip the literal (escapes included; an unterminated one fails to parse later).
                let triple = chars.peek() == Some(&c) && {
                    let mut ahead = chars.clone();
                    ahead.next();
                    ahead.next() == Some(c)
                };
                if triple {
                    chars.next();
                    chars.next();
                }
                let mut quotes = 0;
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        chars.next();
                        quotes = 0;
                        continue;
                    }
                    if d == c {
                        quotes += 1;
                        if !triple || quotes == 3 {
                            break;
                        }
                    } else {
                        quotes = 0;
                    }
                }
                prefix_run = 0;
            }
            '(' | '[' | '{' => {
                depth += 1;
                prefix_run = 0;
            }
            ')' | ']' | '}' => {
                depth = depth.saturating_sub(1);
                prefix_run = 0;
            }
            '!' | '-' => prefix_run += 1,
            c if c.is_whitespace() => {}
            _ => prefix_run = 0,
        }
        if depth > SELECTOR_NESTING_MAX || prefix_run > SELECTOR_NESTING_MAX {
            return Err(format!(
                "expression nests brackets or prefix operators deeper than {SELECTOR_NESTING_MAX} levels"
            ));
        }
    }
    Ok(())
}

// ---- static types ---------------------------------------------------------------------

/// What the type check knows of a subexpression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
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
    fn name(self) -> &'static str {
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

    fn is_numeric(self) -> bool {
        matches!(self, Self::Int | Self::Uint | Self::Double)
    }

    /// Whether a value of this type may be used where `want` is expected.
    fn fits(self, want: Ty) -> bool {
        self == Ty::Dyn || self == want
    }
}

/// Comprehension variables in scope, innermost last.
type Scope = Vec<(String, Ty)>;

fn infer(e: &IdedExpr, scope: &Scope, depth: usize) -> Result<Ty, String> {
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

fn ident_type(name: &str, scope: &Scope) -> Result<Ty, String> {
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

fn field_type(operand: Ty, field: &str) -> Result<Ty, String> {
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

fn index_type(container: Ty, key: Ty) -> Result<Ty, String> {
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

fn comparable(a: Ty, b: Ty) -> bool {
    if a == Ty::Dyn || b == Ty::Dyn {
        return true;
    }
    (a.is_numeric() && b.is_numeric()) || (a == b && matches!(a, Ty::String | Ty::Bytes | Ty::Bool))
}

fn call_type(name: &str, target: Option<Ty>, args: &[Ty]) -> Result<Ty, String> {
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

fn is_known_function(name: &str) -> bool {
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

// ---- runtime values -------------------------------------------------------------------

/// A quantity value: exact signed nano-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantityVal(pub i128);

impl Val for QuantityVal {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<QuantityVal>()
            .is_some_and(|o| o.0 == self.0)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for QuantityVal {}

/// A semantic version value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemverVal(pub Semver);

impl Val for SemverVal {
    fn get_type(&self) -> &Type {
        &SEMVER_TYPE
    }

    fn cel_type() -> &'static Type {
        &SEMVER_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<SemverVal>()
            .is_some_and(|o| o.0.precedence(&self.0) == Ordering::Equal)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for SemverVal {}

/// `device`: driver, attributes and capacity of one device, read in place.
#[derive(Debug, Clone, Copy)]
struct DeviceVal<'a> {
    driver: &'a str,
    device: &'a Device,
}

/// Which of a device's maps a value reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Attributes,
    Capacity,
}

/// `device.attributes` or `device.capacity`: domain → names.
#[derive(Debug, Clone, Copy)]
struct DomainsVal<'a> {
    device: DeviceVal<'a>,
    part: Part,
}

/// `device.attributes["domain"]` or `device.capacity["domain"]`.
#[derive(Debug, Clone)]
struct DomainVal<'a> {
    device: DeviceVal<'a>,
    part: Part,
    domain: String,
}

fn key_of(key: &dyn Val) -> Result<&str, ExecutionError> {
    key.downcast_ref::<CelString>()
        .map(CelString::inner)
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: key.get_type().name().to_owned(),
            want: "string".to_owned(),
        })
}

/// Splits a qualified attribute or capacity name into (domain, id); a name without a
/// domain belongs to the driver's domain.
pub fn split_qualified<'n>(driver: &'n str, name: &'n str) -> (&'n str, &'n str) {
    match name.split_once('/') {
        Some((domain, id)) => (domain, id),
        None => (driver, name),
    }
}

fn attribute_val<'v>(value: &'v AttributeValue) -> Box<dyn Val + 'v> {
    let list =
        |items: Vec<Box<dyn Val + 'v>>| -> Box<dyn Val + 'v> { Box::new(CelList::from(items)) };
    match value {
        AttributeValue::Int(n) => Box::new(CelInt::from(*n)),
        AttributeValue::Bool(b) => Box::new(CelBool::from(*b)),
        AttributeValue::String(s) => Box::new(CelString::from(s.as_str())),
        AttributeValue::Version(v) => version_val(v),
        AttributeValue::Ints(l) => list(l.iter().map(|n| int_val(*n)).collect()),
        AttributeValue::Bools(l) => list(l.iter().map(|b| bool_val(*b)).collect()),
        AttributeValue::Strings(l) => list(l.iter().map(|s| string_val(s)).collect()),
        AttributeValue::Versions(l) => list(l.iter().map(|v| version_val(v)).collect()),
    }
}

fn int_val<'v>(n: i64) -> Box<dyn Val + 'v> {
    Box::new(CelInt::from(n))
}

fn bool_val<'v>(b: bool) -> Box<dyn Val + 'v> {
    Box::new(CelBool::from(b))
}

fn string_val<'v>(s: &'v str) -> Box<dyn Val + 'v> {
    Box::new(CelString::from(s))
}

fn version_val<'v>(v: &'v str) -> Box<dyn Val + 'v> {
    match Semver::parse(v) {
        Ok(version) => Box::new(SemverVal(version)),
        // Validated pools only hold valid versions; a string keeps a bad one visible.
        Err(_) => Box::new(CelString::from(v)),
    }
}

impl<'a> DomainVal<'a> {
    fn lookup<'v>(&self, id: &str) -> Option<Box<dyn Val + 'v>>
    where
        'a: 'v,
    {
        let driver = self.device.driver;
        let device = self.device.device;
        match self.part {
            Part::Attributes => device
                .attributes
                .iter()
                .find(|(name, _)| split_qualified(driver, name) == (self.domain.as_str(), id))
                .map(|(_, value)| attribute_val(value)),
            Part::Capacity => device
                .capacity
                .iter()
                .find(|(name, _)| split_qualified(driver, name) == (self.domain.as_str(), id))
                .map(|(_, cap)| {
                    let nano = i128::try_from(cap.value.nano()).unwrap_or(i128::MAX);
                    Box::new(QuantityVal(nano)) as Box<dyn Val + 'v>
                }),
        }
    }

    fn count(&self) -> usize {
        let driver = self.device.driver;
        let in_domain = |name: &String| split_qualified(driver, name).0 == self.domain;
        match self.part {
            Part::Attributes => self
                .device
                .device
                .attributes
                .keys()
                .filter(|n| in_domain(n))
                .count(),
            Part::Capacity => self
                .device
                .device
                .capacity
                .keys()
                .filter(|n| in_domain(n))
                .count(),
        }
    }
}

impl<'a> Val for DeviceVal<'a> {
    fn get_type(&self) -> &Type {
        &DEVICE_TYPE
    }

    fn cel_type() -> &'static Type {
        &DEVICE_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(*self)
    }
}

impl<'a> Indexer for DeviceVal<'a> {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match key_of(idx)? {
            "driver" => Ok(CowVal::owned(CelString::from(self.driver))),
            "attributes" => Ok(CowVal::owned(DomainsVal {
                device: *self,
                part: Part::Attributes,
            })),
            "capacity" => Ok(CowVal::owned(DomainsVal {
                device: *self,
                part: Part::Capacity,
            })),
            "allowMultipleAllocations" => Ok(CowVal::owned(CelBool::from(
                self.device.sharing == AllocationSharing::Shared,
            ))),
            other => Err(ExecutionError::no_such_key(other)),
        }
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl<'a> Val for DomainsVal<'a> {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &MAP_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(*self)
    }
}

impl<'a> Indexer for DomainsVal<'a> {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        // An unknown domain is an empty map, as Kubernetes' map with a default.
        Ok(CowVal::owned(DomainVal {
            device: self.device,
            part: self.part,
            domain: key_of(idx)?.to_string(),
        }))
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl<'a> Val for DomainVal<'a> {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &MAP_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(self.clone())
    }
}

impl<'a> Indexer for DomainVal<'a> {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let id = key_of(idx)?;
        self.lookup(id)
            .map(CowVal::Owned)
            .ok_or_else(|| ExecutionError::no_such_key(id))
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl<'a> Container for DomainVal<'a> {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(self.lookup(key_of(value)?).is_some())
    }
}

impl<'a> Sizer for DomainVal<'a> {
    fn size(&self) -> CelInt {
        CelInt::from(i64::try_from(self.count()).unwrap_or(i64::MAX))
    }
}

// ---- the Kubernetes libraries ---------------------------------------------------------

fn function_error(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

fn quantity(s: &CelString<'_>) -> Result<QuantityVal, ExecutionError> {
    parse_nano(s.inner())
        .map(QuantityVal)
        .map_err(|e| function_error("quantity", e))
}

fn is_quantity(s: &CelString<'_>) -> CelBool {
    CelBool::from(parse_nano(s.inner()).is_ok())
}

fn quantity_is_greater_than(a: &QuantityVal, b: &QuantityVal) -> CelBool {
    CelBool::from(a.0 > b.0)
}

fn quantity_is_less_than(a: &QuantityVal, b: &QuantityVal) -> CelBool {
    CelBool::from(a.0 < b.0)
}

fn ordering_int(order: Ordering) -> CelInt {
    CelInt::from(match order {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    })
}

fn quantity_compare_to(a: &QuantityVal, b: &QuantityVal) -> CelInt {
    ordering_int(a.0.cmp(&b.0))
}

fn quantity_add(a: &QuantityVal, b: &QuantityVal) -> Result<QuantityVal, ExecutionError> {
    a.0.checked_add(b.0)
        .map(QuantityVal)
        .ok_or_else(|| function_error("add", "quantity overflow"))
}

fn quantity_sub(a: &QuantityVal, b: &QuantityVal) -> Result<QuantityVal, ExecutionError> {
    a.0.checked_sub(b.0)
        .map(QuantityVal)
        .ok_or_else(|| function_error("sub", "quantity overflow"))
}

fn units_of(n: &CelInt) -> Option<i128> {
    i128::from(*n.inner()).checked_mul(NANO_PER_UNIT)
}

fn quantity_add_int(a: &QuantityVal, b: &CelInt) -> Result<QuantityVal, ExecutionError> {
    units_of(b)
        .and_then(|b| a.0.checked_add(b))
        .map(QuantityVal)
        .ok_or_else(|| function_error("add", "quantity overflow"))
}

fn quantity_sub_int(a: &QuantityVal, b: &CelInt) -> Result<QuantityVal, ExecutionError> {
    units_of(b)
        .and_then(|b| a.0.checked_sub(b))
        .map(QuantityVal)
        .ok_or_else(|| function_error("sub", "quantity overflow"))
}

fn quantity_sign(a: &QuantityVal) -> CelInt {
    ordering_int(a.0.cmp(&0))
}

/// The value as an `int`, if it is whole and fits.
fn whole_units(a: &QuantityVal) -> Option<i64> {
    if a.0 % NANO_PER_UNIT != 0 {
        return None;
    }
    i64::try_from(a.0 / NANO_PER_UNIT).ok()
}

fn quantity_is_integer(a: &QuantityVal) -> CelBool {
    CelBool::from(whole_units(a).is_some())
}

fn quantity_as_integer(a: &QuantityVal) -> Result<CelInt, ExecutionError> {
    whole_units(a)
        .map(CelInt::from)
        .ok_or_else(|| function_error("asInteger", "cannot convert value to integer"))
}

fn quantity_as_approximate_float(a: &QuantityVal) -> CelDouble {
    CelDouble::from(a.0 as f64 / NANO_PER_UNIT as f64)
}

fn semver(s: &CelString<'_>) -> Result<SemverVal, ExecutionError> {
    Semver::parse(s.inner())
        .map(SemverVal)
        .map_err(|e| function_error("semver", e))
}

fn is_semver(s: &CelString<'_>) -> CelBool {
    CelBool::from(Semver::parse(s.inner()).is_ok())
}

fn semver_is_greater_than(a: &SemverVal, b: &SemverVal) -> CelBool {
    CelBool::from(a.0.precedence(&b.0) == Ordering::Greater)
}

fn semver_is_less_than(a: &SemverVal, b: &SemverVal) -> CelBool {
    CelBool::from(a.0.precedence(&b.0) == Ordering::Less)
}

fn semver_compare_to(a: &SemverVal, b: &SemverVal) -> CelInt {
    ordering_int(a.0.precedence(&b.0))
}

fn clamp_int(n: u64) -> CelInt {
    CelInt::from(i64::try_from(n).unwrap_or(i64::MAX))
}

fn semver_major(a: &SemverVal) -> CelInt {
    clamp_int(a.0.major())
}

fn semver_minor(a: &SemverVal) -> CelInt {
    clamp_int(a.0.minor())
}

fn semver_patch(a: &SemverVal) -> CelInt {
    clamp_int(a.0.patch())
}

fn register_kubernetes(env: &mut Env) -> Result<(), DeclarationError> {
    cel::add_overload!(env, fn quantity: (CelString) -> Result<QuantityVal>, id = "string_to_quantity")?;
    cel::add_overload!(env, fn is_quantity: (CelString) -> CelBool, id = "is_quantity_string")?;
    cel::add_member_overload!(env, fn quantity_is_greater_than: (QuantityVal, QuantityVal) -> CelBool,
        name = "isGreaterThan", id = "quantity_is_greater_than")?;
    cel::add_member_overload!(env, fn quantity_is_less_than: (QuantityVal, QuantityVal) -> CelBool,
        name = "isLessThan", id = "quantity_is_less_than")?;
    cel::add_member_overload!(env, fn quantity_compare_to: (QuantityVal, QuantityVal) -> CelInt,
        name = "compareTo", id = "quantity_compare_to")?;
    cel::add_member_overload!(env, fn quantity_add: (QuantityVal, QuantityVal) -> Result<QuantityVal>,
        name = "add", id = "quantity_add")?;
    cel::add_member_overload!(env, fn quantity_add_int: (QuantityVal, CelInt) -> Result<QuantityVal>,
        name = "add", id = "quantity_add_int")?;
    cel::add_member_overload!(env, fn quantity_sub: (QuantityVal, QuantityVal) -> Result<QuantityVal>,
        name = "sub", id = "quantity_sub")?;
    cel::add_member_overload!(env, fn quantity_sub_int: (QuantityVal, CelInt) -> Result<QuantityVal>,
        name = "sub", id = "quantity_sub_int")?;
    cel::add_member_overload!(env, fn quantity_sign: (QuantityVal) -> CelInt,
        name = "sign", id = "quantity_sign")?;
    cel::add_member_overload!(env, fn quantity_is_integer: (QuantityVal) -> CelBool,
        name = "isInteger", id = "quantity_is_integer")?;
    cel::add_member_overload!(env, fn quantity_as_integer: (QuantityVal) -> Result<CelInt>,
        name = "asInteger", id = "quantity_as_integer")?;
    cel::add_member_overload!(env, fn quantity_as_approximate_float: (QuantityVal) -> CelDouble,
        name = "asApproximateFloat", id = "quantity_as_approximate_float")?;
    cel::add_overload!(env, fn semver: (CelString) -> Result<SemverVal>, id = "string_to_semver")?;
    cel::add_overload!(env, fn is_semver: (CelString) -> CelBool, id = "is_semver_string")?;
    cel::add_member_overload!(env, fn semver_is_greater_than: (SemverVal, SemverVal) -> CelBool,
        name = "isGreaterThan", id = "semver_is_greater_than")?;
    cel::add_member_overload!(env, fn semver_is_less_than: (SemverVal, SemverVal) -> CelBool,
        name = "isLessThan", id = "semver_is_less_than")?;
    cel::add_member_overload!(env, fn semver_compare_to: (SemverVal, SemverVal) -> CelInt,
        name = "compareTo", id = "semver_compare_to")?;
    cel::add_member_overload!(env, fn semver_major: (SemverVal) -> CelInt,
        name = "major", id = "semver_major")?;
    cel::add_member_overload!(env, fn semver_minor: (SemverVal) -> CelInt,
        name = "minor", id = "semver_minor")?;
    cel::add_member_overload!(env, fn semver_patch: (SemverVal) -> CelInt,
        name = "patch", id = "semver_patch")?;
    cel::add_member_overload!(env, fn list_includes_string: (CelList, CelString) -> CelBool,
        name = "includes", id = "list_includes_string")?;
    cel::add_member_overload!(env, fn list_includes_int: (CelList, CelInt) -> CelBool,
        name = "includes", id = "list_includes_int")?;
    cel::add_member_overload!(env, fn list_includes_bool: (CelList, CelBool) -> CelBool,
        name = "includes", id = "list_includes_bool")?;
    cel::add_member_overload!(env, fn list_includes_semver: (CelList, SemverVal) -> CelBool,
        name = "includes", id = "list_includes_semver")?;
    cel::add_member_overload!(env, fn string_includes: (CelString, CelString) -> CelBool,
        name = "includes", id = "string_includes")?;
    cel::add_member_overload!(env, fn int_includes: (CelInt, CelInt) -> CelBool,
        name = "includes", id = "int_includes")?;
    cel::add_member_overload!(env, fn bool_includes: (CelBool, CelBool) -> CelBool,
        name = "includes", id = "bool_includes")?;
    cel::add_member_overload!(env, fn semver_includes: (SemverVal, SemverVal) -> CelBool,
        name = "includes", id = "semver_includes")?;
    Ok(())
}

/// Whether a list attribute holds `value` (an item equal to it).
fn list_holds(list: &CelList<'_>, value: &dyn Val) -> CelBool {
    CelBool::from(list.iter().any(|item| item.equals(value)))
}

fn list_includes_string(list: &CelList<'_>, value: &CelString<'_>) -> CelBool {
    list_holds(list, value)
}

fn list_includes_int(list: &CelList<'_>, value: &CelInt) -> CelBool {
    list_holds(list, value)
}

fn list_includes_bool(list: &CelList<'_>, value: &CelBool) -> CelBool {
    list_holds(list, value)
}

fn list_includes_semver(list: &CelList<'_>, value: &SemverVal) -> CelBool {
    list_holds(list, value)
}

fn string_includes(a: &CelString<'_>, b: &CelString<'_>) -> CelBool {
    CelBool::from(a.equals(b))
}

fn int_includes(a: &CelInt, b: &CelInt) -> CelBool {
    CelBool::from(a.equals(b))
}

fn bool_includes(a: &CelBool, b: &CelBool) -> CelBool {
    CelBool::from(a.equals(b))
}

fn semver_includes(a: &SemverVal, b: &SemverVal) -> CelBool {
    CelBool::from(a.equals(b))
}

/// Attribute and capacity maps of a device by domain, as selectors see them (for tests
/// and diagnostics).
pub fn domains_of(driver: &str, device: &Device) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in device.attributes.keys().chain(device.capacity.keys()) {
        let (domain, id) = split_qualified(driver, name);
        out.entry(domain.to_string())
            .or_default()
            .push(id.to_string());
    }
    out
}

#[cfg(test)]
#[path = "cel_tests.rs"]
mod tests;
