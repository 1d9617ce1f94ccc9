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

mod library;
mod types;
mod values;
pub use library::domains_of;
use library::*;
use types::*;
pub use values::*;

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

#[cfg(test)]
#[path = "cel_tests.rs"]
mod tests;
