//! The estimated cost of a CEL device selector, checked when it is admitted.
//!
//! Owns [`estimate`]: an upper bound, in Kubernetes' cost units (about one per
//! operation, a tenth per byte a string function reads), of what one evaluation of an
//! expression may cost on any device, and [`SELECTOR_COST_MAX`], the budget a selector
//! must stay within (Kubernetes' `CELSelectorExpressionMaxCost`). Loops multiply: the
//! body of a comprehension costs once per element of its range, so three nested loops
//! over 400 elements cost 64 million and are refused. Sizes of values that only exist at
//! run time are bounded by the device model (at most 32 attributes and capacities, values
//! of at most 64 bytes, driver names of 63); strings and lists built from them are
//! bounded through each function (`split`, `replace`, `+`, `map`). An accumulator that
//! grows faster than linearly per iteration is unbounded and refused. Pure; called by
//! `cel::compile_selector` after the type check.

use cel::common::ast::{operators, EntryExpr, Expr, IdedExpr, LiteralValue};

use crate::model::device::{
    ATTRIBUTE_VALUE_LENGTH_MAX, DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX, DRIVER_NAME_LENGTH_MAX,
};

/// Most estimated cost of one selector evaluation (Kubernetes' budget for device selectors).
pub const SELECTOR_COST_MAX: u64 = 1_000_000;
/// Deepest expression the estimate walks, in nodes from the root.
const ESTIMATE_DEPTH_MAX: usize = 256;
/// A cost or size this large stands for "unbounded".
const UNBOUNDED: u64 = u64::MAX / 4;
/// Accumulator growth probe: sizes the step is estimated at, apart.
const GROWTH_PROBE: u64 = 1_000;

/// The largest a value may be: its length (bytes of a string, entries of a list or
/// map; 1 for a scalar) and the length of its largest element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Size {
    len: u64,
    elem: u64,
}

impl Size {
    const SCALAR: Size = Size { len: 1, elem: 1 };

    fn text(len: u64) -> Size {
        Size { len, elem: 1 }
    }

    fn list(len: u64, elem: u64) -> Size {
        Size { len, elem }
    }
}

/// An evaluation's cost and the size of its result.
#[derive(Debug, Clone, Copy)]
struct Est {
    cost: u64,
    size: Size,
}

/// Comprehension variables in scope, innermost last.
type Scope<'a> = Vec<(&'a str, Size)>;

fn add(a: u64, b: u64) -> u64 {
    a.saturating_add(b).min(UNBOUNDED)
}

fn mul(a: u64, b: u64) -> u64 {
    a.saturating_mul(b).min(UNBOUNDED)
}

/// What reading `len` bytes costs (a tenth of a unit per byte, as Kubernetes counts).
fn bytes_cost(len: u64) -> u64 {
    len.div_ceil(10)
}

/// The estimated cost of one evaluation of `expr`; an error when it exceeds the budget.
pub fn check(expr: &IdedExpr) -> Result<u64, String> {
    let cost = estimate(expr)?;
    if cost >= UNBOUNDED {
        return Err(format!(
            "estimated cost is unbounded (a value grows faster than linearly in a loop); the budget is {SELECTOR_COST_MAX}"
        ));
    }
    if cost > SELECTOR_COST_MAX {
        return Err(format!(
            "estimated cost {cost} exceeds the budget of {SELECTOR_COST_MAX} per evaluation \
             (a loop costs its body once per element, and nested loops multiply)"
        ));
    }
    Ok(cost)
}

/// The estimated cost of one evaluation of `expr` on any device.
pub fn estimate(expr: &IdedExpr) -> Result<u64, String> {
    Ok(walk(expr, &Vec::new(), 0)?.cost)
}

fn walk<'a>(e: &'a IdedExpr, scope: &Scope<'a>, depth: usize) -> Result<Est, String> {
    if depth > ESTIMATE_DEPTH_MAX {
        return Err(format!(
            "expression nests deeper than {ESTIMATE_DEPTH_MAX} levels"
        ));
    }
    let next = depth + 1;
    Ok(match &e.expr {
        Expr::Unspecified | Expr::Struct(_) => Est {
            cost: 1,
            size: Size::SCALAR,
        },
        Expr::Literal(literal) => Est {
            cost: 0,
            size: match literal {
                LiteralValue::String(s) => Size::text(s.len() as u64),
                LiteralValue::Bytes(b) => Size::text(b.len() as u64),
                _ => Size::SCALAR,
            },
        },
        Expr::Ident(name) => Est {
            cost: 1,
            size: scope
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, s)| *s)
                .unwrap_or(Size::SCALAR),
        },
        Expr::List(list) => {
            let mut cost = 10;
            let mut elem = 1;
            for element in &list.elements {
                let est = walk(element, scope, next)?;
                cost = add(cost, est.cost);
                elem = elem.max(est.size.len);
            }
            Est {
                cost,
                size: Size::list(list.elements.len() as u64, elem),
            }
        }
        Expr::Map(map) => {
            let mut cost = 30;
            let mut elem = 1;
            for entry in &map.entries {
                if let EntryExpr::MapEntry(entry) = &entry.expr {
                    let key = walk(&entry.key, scope, next)?;
                    let value = walk(&entry.value, scope, next)?;
                    cost = add(cost, add(key.cost, value.cost));
                    elem = elem.max(value.size.len);
                }
            }
            Est {
                cost,
                size: Size::list(map.entries.len() as u64, elem),
            }
        }
        Expr::Select(select) => {
            let operand = walk(&select.operand, scope, next)?;
            Est {
                cost: add(operand.cost, 1),
                size: if select.test {
                    Size::SCALAR
                } else {
                    field_size(&select.field, operand.size)
                },
            }
        }
        Expr::Comprehension(c) => comprehension(c, scope, next)?,
        Expr::Call(call) => {
            let target = match &call.target {
                Some(t) => Some(walk(t, scope, next)?),
                None => None,
            };
            let mut args = Vec::with_capacity(call.args.len());
            for arg in &call.args {
                args.push(walk(arg, scope, next)?);
            }
            call_est(&call.func_name, target, &args)
        }
    })
}

/// The size of a device field, or of a map entry reached with `.`.
fn field_size(field: &str, operand: Size) -> Size {
    let entries = DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX as u64;
    let value = ATTRIBUTE_VALUE_LENGTH_MAX as u64;
    match field {
        "driver" => Size::text(DRIVER_NAME_LENGTH_MAX as u64),
        "attributes" | "capacity" => Size::list(entries, entries),
        "allowMultipleAllocations" => Size::SCALAR,
        // A domain's entry (an attribute value), or a field of a map built in the expression.
        _ => Size::text(operand.elem.max(value)),
    }
}

fn comprehension<'a>(
    c: &'a cel::common::ast::ComprehensionExpr,
    scope: &Scope<'a>,
    next: usize,
) -> Result<Est, String> {
    let range = walk(&c.iter_range, scope, next)?;
    let init = walk(&c.accu_init, scope, next)?;
    let n = range.size.len;
    let element = Size::list(range.size.elem, range.size.elem);
    let mut inner = scope.clone();
    inner.push((c.iter_var.as_str(), element));
    if let Some(second) = &c.iter_var2 {
        inner.push((second.as_str(), element));
    }
    let with_accu = |accu: Size| {
        let mut s = inner.clone();
        s.push((c.accu_var.as_str(), accu));
        s
    };
    // How the accumulator grows: the step estimated at two accumulator sizes.
    let a0 = init.size;
    let probe = Size::list(add(a0.len, GROWTH_PROBE), a0.elem);
    let step0 = walk(&c.loop_step, &with_accu(a0), next)?;
    let step1 = walk(&c.loop_step, &with_accu(probe), next)?;
    let slope = step1.size.len.saturating_sub(step0.size.len);
    let grows_per_iteration = step0.size.len.saturating_sub(a0.len);
    let final_len = if slope > GROWTH_PROBE {
        UNBOUNDED
    } else {
        add(a0.len, mul(n, grows_per_iteration)).max(a0.len.max(step0.size.len))
    };
    let accu = Size::list(final_len, a0.elem.max(step0.size.elem));
    let cond = walk(&c.loop_cond, &with_accu(accu), next)?;
    let step = walk(&c.loop_step, &with_accu(accu), next)?;
    let result = walk(&c.result, &with_accu(accu), next)?;
    let per_iteration = add(add(cond.cost, step.cost), 1);
    Ok(Est {
        cost: add(
            add(range.cost, init.cost),
            add(mul(n, per_iteration), result.cost),
        ),
        size: result.size,
    })
}

/// A call's cost (its operands' and its own) and the size of its result.
fn call_est(name: &str, target: Option<Est>, args: &[Est]) -> Est {
    let operands = target
        .iter()
        .chain(args)
        .fold(0, |total, e| add(total, e.cost));
    let this = target.map(|t| t.size).unwrap_or(Size::SCALAR);
    let arg = |i: usize| args.get(i).map(|a| a.size).unwrap_or(Size::SCALAR);
    let (own, size) = match name {
        operators::ADD => {
            let (a, b) = (arg(0), arg(1));
            let len = add(a.len, b.len);
            (add(1, bytes_cost(len)), Size::list(len, a.elem.max(b.elem)))
        }
        operators::INDEX | operators::OPT_INDEX => {
            let c = arg(0);
            (1, Size::list(c.elem, c.elem))
        }
        operators::IN => (add(1, arg(1).len), Size::SCALAR),
        operators::EQUALS | operators::NOT_EQUALS => {
            let len = arg(0).len.min(arg(1).len);
            (
                add(1, mul(len, arg(0).elem.max(1)).div_ceil(10)),
                Size::SCALAR,
            )
        }
        operators::CONDITIONAL => {
            let (a, b) = (arg(1), arg(2));
            (1, Size::list(a.len.max(b.len), a.elem.max(b.elem)))
        }
        "size" => (1, Size::SCALAR),
        "contains" | "startsWith" | "endsWith" | "indexOf" | "lastIndexOf" => {
            let len = add(this.len, arg(0).len);
            (add(1, bytes_cost(len)), Size::SCALAR)
        }
        "matches" => {
            let s = if target.is_some() { this } else { arg(0) };
            let pattern = if target.is_some() { arg(0) } else { arg(1) };
            (
                add(1, bytes_cost(mul(s.len, pattern.len.max(1)))),
                Size::SCALAR,
            )
        }
        "split" => (
            add(1, bytes_cost(this.len)),
            Size::list(add(this.len, 1), this.len),
        ),
        "replace" => {
            let len = mul(this.len, arg(1).len.max(1));
            (add(1, bytes_cost(len)), Size::text(len))
        }
        "join" => {
            let len = mul(this.len, add(this.elem, arg(0).len));
            (add(1, bytes_cost(len)), Size::text(len))
        }
        "substring" | "trim" | "lowerAscii" | "upperAscii" | "charAt" => {
            (add(1, bytes_cost(this.len)), Size::text(this.len))
        }
        "format" => {
            let list = arg(0);
            let len = add(this.len, mul(list.len, list.elem.max(20)));
            (add(1, bytes_cost(len)), Size::text(len))
        }
        "string" | "bytes" => (1, Size::text(arg(0).len.max(32))),
        _ => {
            // Anything else reads its operands once and is no larger than they are.
            let len = target
                .iter()
                .chain(args)
                .fold(1, |total, e| add(total, e.size.len));
            let elem = target
                .iter()
                .chain(args)
                .fold(1, |most, e| most.max(e.size.elem));
            (1, Size::list(len, elem))
        }
    };
    Est {
        cost: add(operands, own),
        size,
    }
}

#[cfg(test)]
#[path = "cel_cost_tests.rs"]
mod tests;
